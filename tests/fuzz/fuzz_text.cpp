// libFuzzer target for the text formats the client and server read: the SSE parser (input
// split anywhere gives the same events), chat templates (any template source and messages),
// batch files (the input as a batch input and as an output file to resume) and multipart
// bodies (uploads to /v1/files).
#include "daemon/batch_file.hpp"
#include "daemon/batch_jobs.hpp"
#include "runtime/chat_template.hpp"
#include "runtime/error.hpp"
#include "tests/sse_events.hpp"

#include <cstdint>
#include <algorithm>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string_view in(reinterpret_cast<const char*>(data), size);

    // SSE: whole, byte by byte, and in pieces of a size taken from the input agree.
    const size_t piece = size ? 1 + data[0] % 13 : 1;
    const auto whole = tandem::test::sse_events(in, in.size() + 1);
    if (tandem::test::sse_events(in, 1) != whole || tandem::test::sse_events(in, piece) != whole) std::abort();

    // Chat templates: the input up to the first \x01 is a template source; the texts between
    // later \x01 bytes are the messages' contents.
    const size_t cut = std::min(in.size(), in.find('\x01'));
    const std::string_view src = in.substr(0, cut), rest = in.substr(std::min(in.size(), cut + 1));
    std::vector<tandem::chat_message> messages;
    const char* roles[] = {"system", "user", "assistant", "user", "tool"};
    for (size_t i = 0, at = 0; at < rest.size() && i < 8; ++i) {
        const size_t end = std::min(rest.size(), rest.find('\x01', at));
        messages.push_back({roles[i % 5], std::string(rest.substr(at, end - at))});
        at = end + 1;
    }
    const auto t = tandem::chat_template::parse(src, "<s>", "</s>");
    const std::string with = t.render(messages, true), without = t.render(messages, false);
    if (with.size() < without.size() && t.family() != tandem::chat_family::phi3) std::abort();
    (void)t.stop_strings();

    // Batch files: a refusal is a tandem::error, nothing else. Each request read is read the
    // same again from its own line; a resumed file's whole lines end at a newline.
    namespace batch = tandem::daemon::batch;
    try {
        for (const batch::request_line& r : batch::read_input(in).requests) {
            const batch::json again = {{"custom_id", r.custom_id}, {"method", "POST"}, {"url", r.url}, {"body", r.body}};
            const auto back = batch::parse_line(again.dump(-1, ' ', false, batch::json::error_handler_t::replace), 1);
            const auto* b = std::get_if<batch::request_line>(&back);
            if (b == nullptr || b->custom_id != r.custom_id || b->url != r.url) std::abort();
        }
    } catch (const tandem::error&) {
    }
    try {
        const batch::done_set d = batch::parse_done(in, "fuzz");
        if (d.whole_bytes > in.size() || (d.whole_bytes > 0 && in[d.whole_bytes - 1] != '\n')) std::abort();
    } catch (const tandem::error&) {
    }

    // Multipart bodies: the parts read lie within the body, in order; a refusal says why.
    std::string why;
    if (const auto parts = tandem::daemon::parse_multipart("multipart/form-data; boundary=\"b0und\"", in, why)) {
        const char* at = in.data();
        for (const auto& p : *parts) {
            if (p.data.data() < at || p.data.data() + p.data.size() > in.data() + in.size()) std::abort();
            at = p.data.data() + p.data.size();
        }
    } else if (why.empty()) {
        std::abort();
    }
    return 0;
}
