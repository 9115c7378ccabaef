#!/usr/bin/env bash
# Every relative link of the Markdown files under DIR (an installed share/doc/tandem, or the
# source tree) names a file that is there; usage: doc_links.sh DIR. Web links and anchors
# within a page are not followed; a link's #anchor is dropped.
set -euo pipefail
dir="$1"
n=0 dead=0
while IFS= read -r -d '' md; do
  while IFS= read -r target; do
    case "$target" in http://*|https://*|mailto:*|\#*) continue ;; esac
    n=$((n + 1))
    [ -e "$(dirname "$md")/${target%%#*}" ] || { echo "${md#"$dir"/}: dead link: $target"; dead=$((dead + 1)); }
  done < <(grep -oE '\]\([^)[:space:]]+\)' "$md" | sed -E 's/^\]\((.*)\)$/\1/')
done < <(find "$dir" -name '*.md' -print0)
[ "$n" -gt 0 ] || { echo "no links found under $dir"; exit 1; }
[ "$dead" = 0 ] || exit 1
echo "doc links under $dir: $n, all resolve"
