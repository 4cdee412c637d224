import sys

from specviz.cli import train_main

sys.exit(train_main(sys.argv[1:]))
