#!/usr/bin/env sh
# Regenerate the README's screenshot: the tool's own terminal view, saved by --svg at 100 columns.
set -e
cd "$(dirname "$0")/.."
COLUMNS=100 attncli run examples/cat_milk_sweet.yaml --explain milk,sweet --svg docs/cat_milk_sweet.svg >/dev/null
