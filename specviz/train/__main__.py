import sys

from specviz.train.cli import train_main

sys.exit(train_main(sys.argv[1:]))
