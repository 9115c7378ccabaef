// libFuzzer target for the Jinja engine: any template source (the input up to the first \x01)
// rendered with a conversation whose texts are the rest, under small limits. Every failure
// must be a jinja::error: no crash, hang or unbounded memory.
#include "runtime/jinja/jinja.hpp"

#include <cstdint>
#include <string>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string_view in(reinterpret_cast<const char*>(data), size);
    const size_t cut = std::min(in.size(), in.find('\x01'));
    const std::string_view src = in.substr(0, cut);
    std::string_view rest = in.substr(std::min(in.size(), cut + 1));
    nlohmann::ordered_json messages = nlohmann::ordered_json::array();
    const char* roles[] = {"system", "user", "assistant"};
    for (size_t i = 0; !rest.empty() && i < 8; ++i) {
        const size_t n = std::min(rest.size(), rest.find('\x01'));
        messages.push_back({{"role", roles[i % 3]}, {"content", std::string(rest.substr(0, n))}});
        rest = rest.substr(std::min(rest.size(), n + 1));
    }
    const nlohmann::ordered_json ctx = {{"messages", messages},
                                        {"add_generation_prompt", true},
                                        {"bos_token", "<s>"},
                                        {"eos_token", "</s>"},
                                        {"tools", nlohmann::ordered_json::array({{{"type", "function"}}})}};
    tandem::jinja::render_options opt;
    opt.limits.max_output = 1 << 16;
    opt.limits.max_iterations = 20000;
    opt.limits.max_time = std::chrono::milliseconds(200);
    opt.now = 0;
    try {
        tandem::jinja::template_program::parse(src).render(ctx, opt);
    } catch (const tandem::jinja::error&) {
    }
    return 0;
}
