// Reads Prometheus text exposition back into families, keeping label sets apart.
#include "daemon/cli_metrics.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <set>
#include <sstream>

namespace tandem::cli {

namespace {

struct raw_sample {
    std::string name;
    metric_labels labels;
    double value = 0;
};

double parse_value(const std::string& s) {
    char* end = nullptr;
    const double v = std::strtod(s.c_str(), &end); // takes +Inf and NaN as written by Prometheus
    return end == s.c_str() ? NAN : v;
}

// `name{k="v",...} value [timestamp]`; nullopt for a line that is not a sample.
std::optional<raw_sample> parse_sample(std::string_view line) {
    raw_sample s;
    size_t i = line.find_first_of("{ \t");
    if (i == std::string_view::npos || i == 0) return std::nullopt;
    s.name = std::string(line.substr(0, i));
    if (line[i] == '{') {
        ++i;
        for (;;) {
            while (i < line.size() && (line[i] == ' ' || line[i] == ',')) ++i;
            if (i >= line.size()) return std::nullopt;
            if (line[i] == '}') {
                ++i;
                break;
            }
            const size_t eq = line.find('=', i);
            if (eq == std::string_view::npos || eq + 1 >= line.size() || line[eq + 1] != '"') return std::nullopt;
            std::string key(line.substr(i, eq - i)), value;
            for (i = eq + 2; i < line.size() && line[i] != '"'; ++i) {
                if (line[i] == '\\' && i + 1 < line.size()) {
                    ++i;
                    value += line[i] == 'n' ? '\n' : line[i];
                } else {
                    value += line[i];
                }
            }
            if (i >= line.size()) return std::nullopt;
            ++i; // the closing quote
            s.labels[key] = value;
        }
    }
    std::istringstream rest{std::string(line.substr(i))};
    std::string value;
    if (!(rest >> value)) return std::nullopt;
    s.value = parse_value(value);
    return s;
}

std::optional<std::string> strip_suffix(const std::string& name, std::string_view suffix) {
    if (name.size() <= suffix.size() || !name.ends_with(suffix)) return std::nullopt;
    return name.substr(0, name.size() - suffix.size());
}

// Counts print as integers (15, not 15.0); NaN and infinities as null, which JSON lacks.
nlohmann::json number_or_null(std::optional<double> v) {
    if (!v || !std::isfinite(*v)) return nullptr;
    if (*v == std::floor(*v) && std::fabs(*v) < 9007199254740992.0) return int64_t(*v);
    return *v;
}

nlohmann::json summary_json(const histogram_series& h) {
    return {{"count", number_or_null(h.count)},
            {"sum", number_or_null(h.sum)},
            {"mean", number_or_null(h.count > 0 ? std::optional(h.sum / h.count) : std::nullopt)},
            {"p50", number_or_null(h.quantile(0.5))},
            {"p90", number_or_null(h.quantile(0.9))},
            {"p99", number_or_null(h.quantile(0.99))}};
}

} // namespace

std::optional<double> histogram_series::quantile(double q) const {
    if (buckets.empty()) return std::nullopt;
    const double total = buckets.back().second; // the +Inf bucket counts every sample
    if (!(total > 0)) return std::nullopt;
    const double rank = q * total;
    size_t i = 0;
    while (i + 1 < buckets.size() && buckets[i].second < rank) ++i;
    if (std::isinf(buckets[i].first)) // beyond the last bound: that bound is all we know
        return i > 0 ? std::optional(buckets[i - 1].first) : std::nullopt;
    const double lo = i > 0 ? buckets[i - 1].first : std::min(0.0, buckets[i].first);
    const double lo_count = i > 0 ? buckets[i - 1].second : 0;
    const double in_bucket = buckets[i].second - lo_count;
    if (!(in_bucket > 0)) return buckets[i].first;
    return lo + (buckets[i].first - lo) * (rank - lo_count) / in_bucket;
}

histogram_series histogram_series::since(const histogram_series& older) const {
    bool same = older.buckets.size() == buckets.size() && older.count <= count;
    for (size_t i = 0; same && i < buckets.size(); ++i)
        same = older.buckets[i].first == buckets[i].first && older.buckets[i].second <= buckets[i].second;
    if (!same) return *this; // another daemon since (restarted): all of this one's
    histogram_series d = *this;
    for (size_t i = 0; i < buckets.size(); ++i) d.buckets[i].second -= older.buckets[i].second;
    d.sum -= older.sum;
    d.count -= older.count;
    return d;
}

metric_set metric_set::parse(std::string_view text) {
    std::map<std::string, std::string> types;
    std::vector<raw_sample> samples;
    std::istringstream in{std::string(text)};
    std::string line;
    while (std::getline(in, line)) {
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (line.starts_with("# TYPE ")) {
            std::istringstream t(line.substr(7));
            std::string name, type;
            if (t >> name >> type) types[name] = type;
            continue;
        }
        if (line.empty() || line[0] == '#') continue;
        if (auto s = parse_sample(line)) samples.push_back(std::move(*s));
    }
    // Histograms: declared so, or with `_bucket{le=...}` series (an exposition without TYPE lines).
    std::set<std::string> hist;
    for (const auto& [name, type] : types)
        if (type == "histogram") hist.insert(name);
    for (const auto& s : samples)
        if (auto base = strip_suffix(s.name, "_bucket"); base && s.labels.contains("le")) hist.insert(*base);

    metric_set m;
    for (auto& s : samples) {
        std::optional<std::string> base;
        std::string_view part;
        for (std::string_view suffix : {"_bucket", "_sum", "_count"})
            if (auto b = strip_suffix(s.name, suffix); b && hist.contains(*b)) {
                base = b;
                part = suffix;
                break;
            }
        if (!base) {
            metric_family& f = m.families_[s.name];
            if (f.type.empty()) f.type = types.contains(s.name) ? types[s.name] : "untyped";
            f.samples.emplace_back(std::move(s.labels), s.value);
            continue;
        }
        metric_family& f = m.families_[*base];
        f.type = "histogram";
        double le = INFINITY;
        if (part == "_bucket") {
            if (auto it = s.labels.find("le"); it != s.labels.end()) le = parse_value(it->second);
            s.labels.erase("le");
        }
        auto series = std::find_if(f.histograms.begin(), f.histograms.end(),
                                   [&](const histogram_series& h) { return h.labels == s.labels; });
        if (series == f.histograms.end()) {
            f.histograms.push_back({s.labels, {}, 0, 0});
            series = std::prev(f.histograms.end());
        }
        if (part == "_bucket")
            series->buckets.emplace_back(le, s.value);
        else if (part == "_sum")
            series->sum = s.value;
        else
            series->count = s.value;
    }
    for (auto& [name, f] : m.families_)
        for (auto& h : f.histograms) std::sort(h.buckets.begin(), h.buckets.end());
    return m;
}

const metric_family* metric_set::family(const std::string& name) const {
    const auto it = families_.find(name);
    return it == families_.end() ? nullptr : &it->second;
}

std::optional<double> metric_set::total(const std::string& name) const {
    const metric_family* f = family(name);
    if (!f || f->samples.empty()) return std::nullopt;
    double sum = 0;
    for (const auto& [labels, v] : f->samples) sum += v;
    return sum;
}

std::optional<double> metric_set::total(std::initializer_list<const char*> names) const {
    for (const char* n : names)
        if (auto v = total(std::string(n))) return v;
    return std::nullopt;
}

const histogram_series* metric_set::histogram(const std::string& name) const {
    const metric_family* f = family(name);
    if (!f || f->histograms.empty()) return nullptr;
    for (const auto& h : f->histograms)
        if (h.labels.empty()) return &h;
    return &f->histograms.front();
}

nlohmann::json metric_set::to_json() const {
    nlohmann::json out = nlohmann::json::object();
    for (const auto& [name, f] : families_) {
        if (f.type == "histogram") {
            if (f.histograms.size() == 1 && f.histograms[0].labels.empty()) {
                out[name] = summary_json(f.histograms[0]);
                continue;
            }
            nlohmann::json list = nlohmann::json::array();
            for (const auto& h : f.histograms) {
                nlohmann::json j = summary_json(h);
                j["labels"] = h.labels;
                list.push_back(std::move(j));
            }
            out[name] = std::move(list);
            continue;
        }
        if (f.samples.size() == 1 && f.samples[0].first.empty()) {
            out[name] = number_or_null(f.samples[0].second);
            continue;
        }
        nlohmann::json list = nlohmann::json::array();
        for (const auto& [labels, v] : f.samples) list.push_back({{"labels", labels}, {"value", number_or_null(v)}});
        out[name] = std::move(list);
    }
    return out;
}

} // namespace tandem::cli
