// Option checks and parse-error messages shared by `tandem` and `tandemd`.
#include "daemon/cli_args.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

namespace tandem::cli {

namespace {

std::optional<double> parse_number(const std::string& s, number kind) {
    if (s.empty()) return std::nullopt;
    if (kind == number::integer) {
        long long v = 0;
        const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
        if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
        return double(v);
    }
    char* end = nullptr;
    const double v = std::strtod(s.c_str(), &end);
    if (end != s.c_str() + s.size() || !std::isfinite(v)) return std::nullopt;
    return v;
}

std::string number_text(double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.10g", v);
    return buf;
}

std::string kind_text(number kind) { return kind == number::integer ? "an integer" : "a number"; }

// "a, b or c"
std::string alternatives(const std::vector<std::string>& names) {
    std::string s;
    for (size_t i = 0; i < names.size(); ++i)
        s += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
    return s;
}

// A number check: `ok` says whether v is allowed, `want` what is ("must be at least 0").
CLI::Validator number_check(number kind, std::function<bool(double)> ok, std::string want, std::string desc) {
    return CLI::Validator(
        [kind, ok = std::move(ok), want = std::move(want)](std::string& s) -> std::string {
            const auto v = parse_number(s, kind);
            if (!v) return "expected " + kind_text(kind) + ", got '" + s + "'";
            if (!ok(*v)) return want + ", got " + s;
            return {};
        },
        std::move(desc));
}

const CLI::App* find_app(const CLI::App& app, std::string_view name) {
    if (name.empty() || app.get_name() == name) return &app;
    for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; }))
        if (const CLI::App* a = find_app(*sub, name)) return a;
    return nullptr;
}

const CLI::Option* find_option(const CLI::App& app, const std::string& name) {
    for (const CLI::Option* o : app.get_options())
        if (o->get_name() == name || o->get_name(true) == name) return o;
    for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; }))
        if (const CLI::Option* o = find_option(*sub, name)) return o;
    return nullptr;
}

// The subcommand the user chose (deepest), or app.
const CLI::App& chosen(const CLI::App& app) {
    const CLI::App* a = &app;
    for (;;) {
        const auto subs = a->get_subcommands();
        if (subs.empty()) return *a;
        a = subs.front();
    }
}

std::string program_path(const CLI::App& app) {
    std::string path;
    for (const CLI::App* a = &chosen(app); a; a = a->get_parent())
        path = a->get_name() + (path.empty() ? "" : " " + path);
    return path;
}

std::string one_line(std::string s) {
    std::replace(s.begin(), s.end(), '\n', ' ');
    return s;
}

// "-x: unknown option (did you mean --xy?)" or "word: unexpected argument".
std::string describe_extra(const std::string& arg, const CLI::App& app) {
    if (arg.size() < 2 || arg[0] != '-') return "'" + arg + "': unexpected argument";
    const std::string flag = arg.substr(0, arg.find('='));
    std::vector<std::string> names;
    for (const CLI::Option* o : app.get_options()) {
        const std::string n = o->get_name();
        if (n.starts_with("--")) names.push_back(n.substr(2));
    }
    std::string s = flag + ": unknown option";
    if (flag.starts_with("--"))
        if (auto near = nearest(std::string_view(flag).substr(2), names)) s += " (did you mean --" + *near + "?)";
    return s;
}

} // namespace

CLI::Validator at_least(double lo, number kind) {
    return number_check(kind, [lo](double v) { return v >= lo; }, "must be at least " + number_text(lo),
                        ">= " + number_text(lo));
}

CLI::Validator between(double lo, double hi, number kind) {
    return number_check(kind, [lo, hi](double v) { return v >= lo && v <= hi; },
                        "must be from " + number_text(lo) + " to " + number_text(hi),
                        number_text(lo) + ".." + number_text(hi));
}

CLI::Validator one_of(std::vector<std::string> names) {
    std::string desc;
    for (const auto& n : names) desc += (desc.empty() ? "" : "|") + n;
    return CLI::Validator(
        [names](std::string& s) -> std::string {
            if (std::find(names.begin(), names.end(), s) != names.end()) return {};
            return "expected " + alternatives(names) + ", got '" + s + "'";
        },
        desc);
}

CLI::Validator named(std::vector<std::pair<std::string, std::string>> names) {
    std::vector<std::string> keys;
    for (const auto& [k, v] : names) keys.push_back(k);
    const CLI::Validator check = one_of(keys);
    return CLI::Validator(
        [names, check](std::string& s) -> std::string {
            std::string err = check(s);
            if (!err.empty()) return err;
            for (const auto& [k, v] : names)
                if (k == s) {
                    s = v;
                    break;
                }
            return {};
        },
        check.get_description());
}

CLI::Validator existing_file() {
    return CLI::Validator(
        [](std::string& s) -> std::string {
            std::error_code ec;
            if (std::filesystem::is_regular_file(s, ec)) return {};
            return std::filesystem::exists(s, ec) ? "not a file: " + s : "no such file: " + s;
        },
        "FILE");
}

std::string describe(const CLI::ParseError& e, const CLI::App& app) {
    const std::string msg = e.what();
    // CLI11's messages by kind: "Could not convert: --temp = abc", "The following argument was
    // not expected: x", "--prompt is required", "a excludes b", "--x: At least 1 required ...".
    if (dynamic_cast<const CLI::ConversionError*>(&e)) {
        constexpr std::string_view head = "Could not convert: ";
        if (msg.starts_with(head)) {
            const size_t eq = msg.find(" = ", head.size());
            const std::string name = msg.substr(head.size(), eq - head.size());
            const std::string value = eq == std::string::npos ? "" : msg.substr(eq + 3);
            std::string want = "another value";
            if (const CLI::Option* o = find_option(app, name)) {
                const std::string type = o->get_type_name();
                want = type.starts_with("INT") || type.starts_with("UINT") ? "an integer in range"
                       : type.starts_with("FLOAT")                        ? "a number"
                                                                          : want;
            }
            return name + ": expected " + want + ", got '" + value + "'";
        }
        if (const size_t at = msg.find(": too many inputs for a flag"); at != std::string::npos)
            return msg.substr(0, at) + ": takes no value";
        return one_line(msg);
    }
    if (dynamic_cast<const CLI::ExtrasError*>(&e)) {
        const CLI::App* where = find_app(app, e.get_name());
        if (!where) where = &chosen(app);
        std::vector<std::string> extra = where->remaining(false);
        if (extra.empty()) return one_line(msg);
        return describe_extra(extra.front(), *where); // the rest are most likely its values
    }
    if (dynamic_cast<const CLI::RequiredError*>(&e)) {
        if (const size_t at = msg.find(" is required"); at != std::string::npos && msg.starts_with("-"))
            return msg.substr(0, at) + ": required";
        return one_line(msg);
    }
    if (dynamic_cast<const CLI::ExcludesError*>(&e)) {
        if (const size_t at = msg.find(" excludes "); at != std::string::npos)
            return msg.substr(0, at) + ": cannot be used with " + msg.substr(at + 10);
        return one_line(msg);
    }
    if (dynamic_cast<const CLI::RequiresError*>(&e)) {
        if (const size_t at = msg.find(" requires "); at != std::string::npos)
            return msg.substr(0, at) + ": needs " + msg.substr(at + 10);
        return one_line(msg);
    }
    if (dynamic_cast<const CLI::ArgumentMismatch*>(&e)) {
        // "--x: At least 1 required but received 0", "Expected exactly 1 arguments to --x, got 0", ...
        std::string name;
        if (const size_t to = msg.find(" arguments to "); to != std::string::npos)
            name = msg.substr(to + 14, msg.find(',', to) - to - 14);
        else
            name = msg.substr(0, msg.find(':'));
        if (msg.find("At Most") != std::string::npos) return name + ": given more than once"; // "At Most 1 required but received 2"
        return name + ": needs a value";
    }
    return one_line(msg); // ValidationError: "--x: <our check's problem>"
}

int usage_error(const CLI::App& app, std::string_view what) {
    const CLI::App* root = &app;
    while (root->get_parent()) root = root->get_parent();
    std::fprintf(stderr, "%s: %.*s\nRun '%s --help' for usage.\n", root->get_name().c_str(), int(what.size()),
                 what.data(), program_path(app).c_str());
    return exit_usage;
}

void add_version_flag(CLI::App& app) {
    app.set_version_flag("--version", app.get_name() + " " TANDEM_VERSION, "print the version and exit");
}

std::optional<int> parse_args(CLI::App& app, int argc, const char* const* argv, const rewrite_error& rewrite) {
    try {
        app.parse(argc, argv);
        return std::nullopt;
    } catch (const CLI::ParseError& e) {
        if (e.get_exit_code() == 0) return app.exit(e); // --help: printed to stdout
        std::optional<std::string> better = rewrite ? rewrite(e) : std::nullopt;
        return usage_error(app, better ? *better : describe(e, app));
    }
}

size_t edit_distance(std::string_view a, std::string_view b) {
    // Optimal string alignment: Levenshtein plus swaps of neighbours ("stauts").
    std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
    for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
    for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
    for (size_t i = 1; i <= a.size(); ++i)
        for (size_t j = 1; j <= b.size(); ++j) {
            d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] != b[j - 1])});
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
                d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
        }
    return d[a.size()][b.size()];
}

std::optional<std::string> nearest(std::string_view word, const std::vector<std::string>& names) {
    if (word.size() < 2) return std::nullopt;
    std::optional<std::string> best;
    size_t best_d = SIZE_MAX;
    for (const auto& n : names) {
        const size_t d = edit_distance(word, n);
        if (d == 0 || d > (n.size() <= 4 ? 1u : 2u)) continue;
        if (d < best_d) {
            best_d = d;
            best = n;
        }
    }
    return best;
}

} // namespace tandem::cli
