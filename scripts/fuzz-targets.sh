#!/usr/bin/env bash
# Prints every fuzz target as package:FuzzName, found by grepping _test.go files.
cd "$(dirname "$0")/.."
grep -rlE '^func Fuzz[A-Za-z0-9_]+\(f \*testing\.F\)' --include='*_test.go' . 2>/dev/null | sort | while read -r f; do
	pkg="./$(dirname "${f#./}")"
	grep -oE '^func Fuzz[A-Za-z0-9_]+' "$f" | sed 's/^func //' | while read -r t; do echo "$pkg:$t"; done
done
