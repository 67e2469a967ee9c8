"""Studies: each paper's central claims measured here. One module per claim, each runnable as
`python -m studies.NAME [--tiny | --gpu] [--out DIR | --record]`, writing runs/studies/NAME/ (result.json, a figure,
README.md); `--record` writes the committed results, benchmarks/studies/NAME/, instead. `python -m studies.table`
writes the README's table of the claims from the committed results.

Sits above the task packages: it may import any of them; nothing imports it.
"""
