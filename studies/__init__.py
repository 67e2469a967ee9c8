"""Studies: each paper's central claims measured here. One module per claim, each runnable as
`python -m studies.NAME [--tiny] [--out DIR | --record]`, writing runs/studies/NAME/ (result.json, a figure,
README.md); `--record` writes the committed results, benchmarks/studies/NAME/, instead.

Sits above the task packages: it may import any of them; nothing imports it.
"""
