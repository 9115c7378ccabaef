// spdlog set-up shared by every subsystem logger.
#include "runtime/log.hpp"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <cstdlib>
#include <mutex>
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

void init_locked(std::string_view level) {
    std::string chosen(level);
    if (const char* env = std::getenv("TANDEM_LOG"); env && *env) chosen = env;
    g_level = spdlog::level::from_str(chosen);
    g_initialised = true;
    spdlog::apply_all([](const std::shared_ptr<spdlog::logger>& l) { l->set_level(g_level); });
}

} // namespace

void init_logging(std::string_view level) {
    std::lock_guard lock(g_mutex);
    init_locked(level);
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
