// `tandem chat`'s input: libedit's line editor and history on a terminal, std::getline elsewhere.
#include "daemon/cli_line_reader.hpp"

#include "runtime/log.hpp"

#include <histedit.h>

#include <cerrno>
#include <clocale>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <string_view>

#include <fcntl.h>
#include <langinfo.h>
#include <sys/stat.h>
#include <unistd.h>

namespace tandem::cli {

std::string history_path() {
    if (const char* state = std::getenv("XDG_STATE_HOME"); state && *state == '/')
        return std::string(state) + "/tandem/history";
    if (const char* home = std::getenv("HOME"); home && *home) return std::string(home) + "/.local/state/tandem/history";
    return {};
}

namespace {

// Piped input: lines as they come, no prompt, no editing (scripts see what they always saw).
class plain_reader final : public line_reader {
public:
    result read() override {
        std::string line;
        errno = 0;
        if (std::getline(std::cin, line)) return {outcome::line, line};
        if (errno == EINTR) { // Ctrl-C while waiting for a line
            std::cin.clear();
            std::clearerr(stdin);
            return {outcome::interrupted, {}};
        }
        return {outcome::end, {}};
    }
};

// libedit counts every byte of a prompt as a column unless it sits between two marker
// characters: colour codes go between them.
std::string mark_escapes(const std::string& prompt, char marker) {
    std::string out;
    for (size_t i = 0; i < prompt.size(); ++i) {
        if (prompt[i] != '\033') {
            out += prompt[i];
            continue;
        }
        const size_t end = prompt.find('m', i);
        if (end == std::string::npos) {
            out += prompt.substr(i);
            break;
        }
        out += marker + prompt.substr(i, end - i + 1) + marker;
        i = end;
    }
    return out;
}

class edit_reader final : public line_reader {
public:
    explicit edit_reader(const std::string& prompt) : prompt_(mark_escapes(prompt, marker)) {
        // libedit decodes input through the locale, and drops bytes it cannot decode: what is
        // typed goes to the daemon as UTF-8, so a locale of another charset (C, POSIX) gives way.
        std::setlocale(LC_CTYPE, "");
        if (std::string_view(nl_langinfo(CODESET)) != "UTF-8") std::setlocale(LC_CTYPE, "C.UTF-8");
        el_ = el_init("tandem", stdin, stdout, stderr);
        hist_ = history_init();
        HistEvent ev;
        history(hist_, &ev, H_SETSIZE, history_lines);
        history(hist_, &ev, H_SETUNIQUE, 1);
        el_set(el_, EL_CLIENTDATA, this);
        el_set(el_, EL_PROMPT_ESC, &edit_reader::prompt_of, marker);
        el_set(el_, EL_EDITOR, "emacs");
        el_set(el_, EL_HIST, history, hist_);
        el_source(el_, nullptr); // ~/.editrc ($EDITRC): key bindings, vi mode
        path_ = history_path();
        if (!path_.empty()) history(hist_, &ev, H_LOAD, path_.c_str()); // none yet is fine
    }
    ~edit_reader() override {
        history_end(hist_);
        el_end(el_);
    }

    result read() override {
        int count = 0;
        errno = 0;
        const char* line = el_gets(el_, &count);
        if (line && count > 0) {
            std::string s(line, size_t(count));
            while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
            return {outcome::line, s};
        }
        if (count < 0 && errno == EINTR) {
            // What was typed is still in the buffer (the next el_gets starts a fresh line).
            const LineInfo* li = el_line(el_);
            return {outcome::interrupted, std::string(li->buffer, li->lastchar)};
        }
        return {outcome::end, {}};
    }

    void remember(const std::string& line) override {
        if (line.empty() || line.size() > history_line_bytes) return;
        HistEvent ev;
        history(hist_, &ev, H_ENTER, line.c_str());
        save();
    }

private:
    static constexpr char marker = '\1';

    static char* prompt_of(EditLine* el) {
        void* self = nullptr;
        el_get(el, EL_CLIENTDATA, &self);
        return static_cast<edit_reader*>(self)->prompt_.data();
    }

    // The whole history, rewritten after each line (it is bounded), private to the user.
    void save() {
        if (path_.empty() || failed_) return;
        const std::filesystem::path p(path_);
        std::error_code ec;
        std::filesystem::create_directories(p.parent_path().parent_path(), ec);
        ::mkdir(p.parent_path().c_str(), 0700); // exists already: fine
        const int fd = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        FILE* f = fd < 0 ? nullptr : ::fdopen(fd, "w");
        if (f) {
            ::fchmod(fd, 0600);
            HistEvent ev;
            const bool ok = history(hist_, &ev, H_SAVE_FP, f) >= 0;
            if (std::fclose(f) == 0 && ok) return;
        } else if (fd >= 0) {
            ::close(fd);
        }
        failed_ = true; // say it once, not after every line
        logger("chat")->warn("cannot write the chat history to {}: {}", path_, std::strerror(errno));
    }

    std::string prompt_;
    std::string path_;
    EditLine* el_ = nullptr;
    History* hist_ = nullptr;
    bool failed_ = false;
};

} // namespace

std::unique_ptr<line_reader> line_reader::make(bool terminal, const std::string& prompt) {
    if (terminal) return std::make_unique<edit_reader>(prompt);
    return std::make_unique<plain_reader>();
}

} // namespace tandem::cli
