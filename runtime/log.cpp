// spdlog set-up shared by every subsystem logger.
#include "runtime/log.hpp"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <cstdlib>
#include <mutex>
#include <optional>
#include <string>

namespace tandem {
namespace {

std::mutex g_mutex;
spdlog::level::level_enum g_level = spdlog::level::info;
bool g_initialised = false;

std::shared_ptr<spdlog::sinks::sink> stderr_sink() {
    static auto sink = [] {
        auto s = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
        // journald stamps time and unit itself; a terminal gets a short time stamp.
        if (std::getenv("JOURNAL_STREAM"))
            s->set_pattern("%n: %l: %v");
        else
            s->set_pattern("[%H:%M:%S.%e] %n %^%l%$: %v");
        return s;
    }();
    return sink;
}

// spdlog reads any name it does not know as "off": a typo in TANDEM_LOG would silence every log.
std::optional<spdlog::level::level_enum> level_named(std::string_view name) {
    const auto l = spdlog::level::from_str(std::string(name));
    if (l == spdlog::level::off && name != "off") return std::nullopt;
    return l;
}

// Returns TANDEM_LOG's value when it is not a level (it is then ignored).
std::string init_locked(std::string_view level) {
    g_level = level_named(level).value_or(spdlog::level::info);
    std::string bad;
    if (const char* env = std::getenv("TANDEM_LOG"); env && *env) {
        if (auto l = level_named(env))
            g_level = *l;
        else
            bad = env;
    }
    g_initialised = true;
    spdlog::apply_all([](const std::shared_ptr<spdlog::logger>& l) { l->set_level(g_level); });
    return bad;
}

} // namespace

void init_logging(std::string_view level) {
    std::string bad;
    {
        std::lock_guard lock(g_mutex);
        bad = init_locked(level);
    }
    if (!bad.empty())
        logger("log")->warn("TANDEM_LOG={} is not a log level (trace, debug, info, warn, error, critical, off); using {}",
                            bad, spdlog::level::to_string_view(g_level));
}

std::shared_ptr<spdlog::logger> logger(std::string_view subsystem) {
    std::lock_guard lock(g_mutex);
    if (!g_initialised) init_locked("info");
    std::string name(subsystem);
    if (auto l = spdlog::get(name)) return l;
    auto l = std::make_shared<spdlog::logger>(name, stderr_sink());
    l->set_level(g_level);
    spdlog::register_logger(l);
    return l;
}

} // namespace tandem
