"""The command line, one module per command family; every command is a thin layer over the library and an error
a user can cause prints one line. `main` (specviz/cli/main.py) puts the commands together:

    main.py      the `specviz` parser and its error handling        generate.py  generate, drafters, models, fetch
    specviz/serve/cli.py   serve, load-bench                        specviz/bench/cli.py   bench, batch-cost
    specviz/train/cli.py   train                                    export.py    export vllm, export llamacpp
    specviz/llamacpp/cli.py   llamacpp build, llamacpp serve

The options several commands share are in specviz/arguments.py, below every command family (bench and serve
import it; the commands import none of each other).
"""
