// libFuzzer target for the text formats the client and server read: the SSE parser (input
// split anywhere gives the same events) and chat templates (any template source and messages).
#include "runtime/chat_template.hpp"
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
    return 0;
}
