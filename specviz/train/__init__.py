"""Training the drafters for one target: self-distillation data (data.py), then the EAGLE head (eagle.py),
the Medusa heads (medusa.py) and the independent draft model (draft.py), through one loop (loop.py).
`specviz train ...` (specviz/cli.py) is the command line; docs/training.md the guide."""
