// A sandboxed Jinja engine for chat templates: the Jinja2 subset models' templates use, as
// Hugging Face's apply_chat_template runs it (ImmutableSandboxedEnvironment, trim_blocks and
// lstrip_blocks, loopcontrols, its tojson, raise_exception and strftime_now, the generation
// tag). A template is data from a downloaded file: every failure is a jinja::error, and output
// size, loop iterations, call depth and time are bounded.
#pragma once

#include "runtime/jinja/ast.hpp"
#include "runtime/jinja/value.hpp"

#include <chrono>
#include <ctime>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace tandem::jinja {

struct render_limits {
    size_t max_output = size_t(4) << 20;        // bytes of output (and of any one string built)
    uint64_t max_iterations = 1'000'000;         // loop iterations and items built, all loops together
    int max_depth = 64;                          // nested macro calls
    std::chrono::milliseconds max_time{2000};    // wall time of one render
};

struct render_options {
    render_limits limits;
    // strftime_now's clock: unset, the local time now (as transformers' datetime.now()); set,
    // this instant formatted in UTC (tests fix it).
    std::optional<std::time_t> now;
};

class template_program {
public:
    // Parses `source`; throws jinja::error naming the construct and line it cannot take.
    static template_program parse(std::string_view source);

    // Renders with `context` (a dict: messages, tools, add_generation_prompt, bos_token, ...).
    // Throws jinja::error (undefined use, type errors, raise_exception, sandbox refusals,
    // limits).
    std::string render(const value& context, const render_options& opt = {}) const;
    std::string render(const nlohmann::ordered_json& context, const render_options& opt = {}) const;

private:
    std::shared_ptr<const body> body_;
};

} // namespace tandem::jinja
