// Server-Sent Events: an incremental parser for the event streams tandemd sends.
#pragma once

#include <functional>
#include <string>
#include <string_view>

namespace tandem::ipc {

// Incremental SSE parser (the WHATWG event-stream format): bytes in any split, one callback
// per complete event with its data lines joined by '\n'. Comments and fields other than
// data are skipped; CRLF, CR and LF all end lines.
class sse_parser {
public:
    // `on_data` returns false to stop: feed() then returns false and drops what is left.
    bool feed(std::string_view bytes, const std::function<bool(std::string_view data)>& on_data);

private:
    bool line(std::string_view l, const std::function<bool(std::string_view)>& on_data);

    std::string line_;        // the unfinished line
    std::string data_;        // data of the event being read
    bool has_data_ = false;
    bool after_cr_ = false;   // the last byte was CR: a following LF belongs to it
};

} // namespace tandem::ipc
