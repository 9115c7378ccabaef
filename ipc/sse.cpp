// Server-Sent Events parser (the WHATWG event-stream format, the parts OpenAI streams use).
#include "ipc/sse.hpp"

namespace tandem::ipc {

bool sse_parser::feed(std::string_view bytes, const std::function<bool(std::string_view)>& on_data) {
    for (char c : bytes) {
        if (c == '\n' && after_cr_) { // the LF of a CRLF: the line already ended
            after_cr_ = false;
            continue;
        }
        after_cr_ = c == '\r';
        if (c == '\n' || c == '\r') {
            const std::string l = std::move(line_);
            line_.clear();
            if (!line(l, on_data)) return false;
        } else {
            line_.push_back(c);
        }
    }
    return true;
}

bool sse_parser::line(std::string_view l, const std::function<bool(std::string_view)>& on_data) {
    if (l.empty()) { // a blank line dispatches the event
        if (!has_data_) return true;
        const std::string data = std::move(data_);
        data_.clear();
        has_data_ = false;
        return on_data(data);
    }
    if (l[0] == ':') return true; // a comment (servers send these as keep-alives)
    const size_t colon = l.find(':');
    const std::string_view field = l.substr(0, colon);
    std::string_view value = colon == std::string_view::npos ? std::string_view{} : l.substr(colon + 1);
    if (value.starts_with(' ')) value.remove_prefix(1);
    if (field != "data") return true; // event, id, retry: nothing here needs them
    if (has_data_) data_.push_back('\n');
    data_.append(value);
    has_data_ = true;
    return true;
}

} // namespace tandem::ipc
