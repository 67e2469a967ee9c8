"""Studies: each paper's central claims measured here (issue 17). One module per claim, each runnable as
`python -m studies.NAME [--tiny]`, writing `benchmarks/studies/NAME/` (result.json, a figure, README.md).

Sits above the task packages: it may import any of them; nothing imports it.
"""
