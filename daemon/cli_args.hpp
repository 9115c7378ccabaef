// Command lines of `tandem` and `tandemd`: value checks and parse errors as one clear line.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tandem::cli {

// Exit code of every command-line mistake, in both programs.
inline constexpr int exit_usage = 2;

// Checks for option values. A failure reads "<option>: <problem>" (CLI11's own checks print
// ranges of 300 digits and maps as {a->0,b->1}).
enum class number { integer, real };
// "must be at least LO, got X"; a value that is not a number: "expected an integer, got X".
CLI::Validator at_least(double lo, number kind = number::integer);
// "must be from LO to HI, got X".
CLI::Validator between(double lo, double hi, number kind = number::integer);
// "expected a, b or c, got X".
CLI::Validator one_of(std::vector<std::string> names);
// one_of, then the name is replaced by its value's text (an enum's number): for an option
// that stores an enum.
CLI::Validator named(std::vector<std::pair<std::string, std::string>> names);
// "no such file: X".
CLI::Validator existing_file();

// --version on `app`: prints "<app's name> <Tandem's version>" and exits 0 (through parse_args).
void add_version_flag(CLI::App& app);

// Parses argv. nullopt: parsed, go on. Otherwise the exit code: 0 after --help (printed), or
// exit_usage after a mistake, printed to stderr as
//   <prog>: <option>: <problem>
//   Run '<prog> [<subcommand>] --help' for usage.
// `rewrite` may put a better line in place of "<option>: <problem>" (a mistyped command).
using rewrite_error = std::function<std::optional<std::string>(const CLI::ParseError&)>;
std::optional<int> parse_args(CLI::App& app, int argc, const char* const* argv, const rewrite_error& rewrite = {});

// "<option>: <problem>" for a parse error of `app` (one line).
std::string describe(const CLI::ParseError& e, const CLI::App& app);

// Prints a usage mistake found after parsing, as parse_args prints one; returns exit_usage.
int usage_error(const CLI::App& app, std::string_view what);

// Edit distance (insertions, deletions, substitutions and swaps of neighbours count 1).
size_t edit_distance(std::string_view a, std::string_view b);

// The name nearest to `word` among `names` that is a likely typo of it: at most 1 edit away
// from a name of up to 4 letters, 2 from a longer one; words under 2 letters match nothing.
std::optional<std::string> nearest(std::string_view word, const std::vector<std::string>& names);

} // namespace tandem::cli
