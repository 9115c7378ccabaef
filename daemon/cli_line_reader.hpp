// Lines typed at `tandem chat`: edited with libedit (and kept in a history file) on a terminal,
// read as plain lines otherwise.
#pragma once

#include <memory>
#include <string>

namespace tandem::cli {

class line_reader {
public:
    enum class outcome { line, interrupted, end };
    struct result {
        outcome what = outcome::end;
        std::string text; // the line; for `interrupted`, what had been typed so far
    };

    virtual ~line_reader() = default;
    // One line, without its newline. `interrupted`: SIGINT came (the caller's handler must not
    // restart reads: SA_RESTART off).
    virtual result read() = 0;
    // Keeps a line sent to the model in the history (and its file), for the Up arrow.
    virtual void remember(const std::string& line) { (void)line; }

    // libedit when stdin and stdout are both terminals, with `prompt` (its colour codes are
    // allowed: they take no room) and the history file history_path(); plain lines otherwise.
    static std::unique_ptr<line_reader> make(bool terminal, const std::string& prompt);
};

// $XDG_STATE_HOME/tandem/history, else ~/.local/state/tandem/history; empty when neither is known.
std::string history_path();

// Lines the history keeps (older ones are dropped), and the longest line it keeps.
inline constexpr int history_lines = 1000;
inline constexpr size_t history_line_bytes = 4096;

} // namespace tandem::cli
