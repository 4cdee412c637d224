"""python -m specviz {generate,models,train,bench} ..."""
from specviz.cli.main import main

raise SystemExit(main())
