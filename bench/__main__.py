"""Run every benchmark: python -m bench [name ...]."""

import sys

from bench import training_parity

BENCHES = {"training-parity": training_parity.main}


def main(names: list[str]) -> int:
    for name in names or list(BENCHES):
        if name not in BENCHES:
            print(f"unknown benchmark {name!r}; choose from {sorted(BENCHES)}", file=sys.stderr)
            return 2
        BENCHES[name]()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
