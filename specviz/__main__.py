"""python -m specviz {generate,models,train,bench} ..."""
from specviz.cli import main

raise SystemExit(main())
