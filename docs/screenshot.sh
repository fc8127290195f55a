#!/usr/bin/env sh
# Regenerate the README's screenshot: the tool's own terminal view, saved by --svg at --width 100 columns.
set -e
cd "$(dirname "$0")/.."
attncli examples run cat_milk_sweet --explain milk,sweet --svg docs/cat_milk_sweet.svg --width 100 >/dev/null
