# The two commands of the README work on a fresh machine:
#   make train   set up, then run the toy training on 2 ranks (JSONL under outputs/)
#   make test    set up, then run the whole test suite
.PHONY: setup train test bench clean

setup:
	bash scripts/setup.sh

train: setup
	bash scripts/train.sh

test: setup
	.venv/bin/python -m pytest

clean:
	rm -rf .venv outputs .pytest_cache .hypothesis
