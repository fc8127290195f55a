#!/usr/bin/env sh
# Regenerate the README's pictures, each with the command the README shows next to it:
# the Nadaraya-Watson heatmap (--plot), a screenshot of the interactive page (--html; needs
# playwright and chromium), and the LaTeX of the cat/milk example (--format latex).
set -e
cd "$(dirname "$0")/.."
attncli examples run nadaraya_watson -q --plot docs/nadaraya_watson.png --dpi 120
attncli examples run cat_milk_sweet -q --html docs/cat_milk.html
python docs/page_screenshot.py docs/cat_milk.html docs/page.png
rm docs/cat_milk.html
attncli examples run cat_milk_sweet --steps scores,weights,output -x milk,cat --format latex > docs/cat_milk.tex
