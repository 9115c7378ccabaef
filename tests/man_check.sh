#!/usr/bin/env bash
# The manual pages agree with the programs: every option of `tandemd --help` is in tandemd(8),
# every option of `tandem --help` and of each subcommand's --help in tandem(1), every key of
# `tandemd --list-keys` in tandemd.conf(5), and each page names no option or key the programs
# lack; `man --warnings` renders each page without a warning. Usage: man_check.sh TANDEM TANDEMD MANDIR
set -euo pipefail
tandem="$1" tandemd="$2" mandir="$3"
command -v man >/dev/null || { echo "man not found: skipped"; exit 77; }
fail=0
bad() { echo "$*"; fail=1; }

# A page's text with roff's escapes for - and \ and its font changes taken out; with a
# section name, only that section (up to the next .SH).
text_of() {
  local page="$1" section="${2:-}"
  if [ -n "$section" ]; then
    awk -v s=".SH $section" '$0 == s || $0 == s "\"" {on = 1; next} /^\.SH / {on = 0} on' "$page"
  else
    cat "$page"
  fi | sed -e 's/\\-/-/g' -e 's/\\f[BIRP]//g' -e 's/\\e/\\/g'
}
# The options of a CLI11 help text: `-m`, `--model`, ... one a line.
options_of() {
  sed -n '/^Options:/,/^$/p' | grep -E '^ +-' | sed -E 's/^ +([^ ]+).*/\1/' | tr ',' '\n' | grep -E '^-'
}
mentions() { # TEXT OPTION: the option as a word of its own
  grep -qE -- "(^|[^-a-zA-Z0-9_])$2([^-a-zA-Z0-9_]|$)" <<<"$1"
}
# Every option in `have` is in `page_text`, and every long option in `section_text` is in `have`.
agree() {
  local page="$1" have="$2" page_text="$3" section_text="$4" o
  for o in $have; do
    [ "$o" = -h ] || [ "$o" = --help ] || mentions "$page_text" "$o" || bad "$page: no $o"
  done
  for o in $(grep -oE -- '(^|[^-a-zA-Z0-9_])--[a-z][-a-z0-9]*' <<<"$section_text" | sed 's/^[^-]*//' | sort -u); do
    grep -qx -- "$o" <<<"$have" || bad "$page: $o is not an option of the program"
  done
}

# Each page renders without a warning.
for page in "$mandir"/tandem.1 "$mandir"/tandemd.8 "$mandir"/tandemd.conf.5; do
  [ -f "$page" ] || { bad "missing: $page"; continue; }
  warnings="$(MANWIDTH=80 man --warnings -l "$page" 2>&1 >/dev/null)" || bad "$page: man failed"
  [ -z "$warnings" ] || bad "$page: man --warnings: $warnings"
done

# tandemd(8): the options of tandemd --help, in its OPTIONS section.
page="$mandir/tandemd.8"
have="$("$tandemd" --help | options_of | sort -u)"
[ -n "$have" ] || bad "no options read from tandemd --help"
agree "$page" "$have" "$(text_of "$page" OPTIONS)" "$(text_of "$page" OPTIONS)"

# tandemd.conf(5): every key, each an entry (`.TP` then `.B key`) of its KEYS section.
page="$mandir/tandemd.conf.5"
keys="$("$tandemd" --list-keys)"
[ -n "$keys" ] || bad "no keys from tandemd --list-keys"
entries="$(awk '/^\.SH KEYS/ {on = 1; next} /^\.SH / {on = 0} on && tp && /^\.B / {print $2} {tp = on && /^\.TP/}' "$page")"
for k in $keys; do grep -qx -- "$k" <<<"$entries" || bad "$page: no entry for the key $k"; done
for k in $entries; do grep -qx -- "$k" <<<"$keys" || bad "$page: $k is not a key of tandemd"; done

# tandem(1): the options of tandem --help and of every subcommand's --help; every subcommand.
page="$mandir/tandem.1"
subs="$("$tandem" --help | sed -n '/^Subcommands:/,/^$/p' | grep -E '^  [a-z]' | awk '{print $1}')"
[ -n "$subs" ] || bad "no subcommands read from tandem --help"
# (`tandem help [COMMAND]` has no options: `tandem help --help` asks for the command "--help")
# (a subcommand's own subcommands too: `tandem guide compile --help`)
subcommands_of() { sed -n '/^Subcommands:/,/^$/p' | grep -E '^  [a-z]' | awk '{print $1}'; }
have="$( { "$tandem" --help | options_of
           for s in $subs; do
             [ "$s" = help ] && continue
             "$tandem" "$s" --help | options_of
             for n in $("$tandem" "$s" --help | subcommands_of); do "$tandem" "$s" "$n" --help | options_of; done
           done; } | sort -u)"
all="$(text_of "$page")"
for s in $subs; do mentions "$all" "tandem $s" || bad "$page: no subcommand $s"; done
agree "$page" "$have" "$all" "$(text_of "$page" "THE DAEMON'S CLIENT"; text_of "$page" "OFFLINE COMMANDS")"

[ "$fail" = 0 ] || exit 1
echo "man pages: render without warnings; options of tandem (and $(wc -w <<<"$subs") subcommands) and tandemd, $(wc -w <<<"$keys") config keys: all described, none extra"
