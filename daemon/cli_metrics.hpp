// The daemon's /metrics (Prometheus text format 0.0.4) read back: label sets kept, histograms summarised.
#pragma once

#include <nlohmann/json.hpp>

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tandem::cli {

using metric_labels = std::map<std::string, std::string>;

// One histogram series: cumulative counts by upper bound (+Inf last), as exposed.
struct histogram_series {
    metric_labels labels; // without `le`
    std::vector<std::pair<double, double>> buckets; // [upper bound, cumulative count], ascending
    double sum = 0, count = 0;

    // The q-quantile (0..1), interpolated linearly inside its bucket as Prometheus's
    // histogram_quantile does; past the last finite bound, that bound. nullopt: no samples.
    std::optional<double> quantile(double q) const;
    // What was observed between an older sample of the same series and this one.
    histogram_series since(const histogram_series& older) const;
};

struct metric_family {
    std::string type; // counter, gauge, histogram, untyped
    std::vector<std::pair<metric_labels, double>> samples; // counters, gauges: one per label set
    std::vector<histogram_series> histograms;              // histograms: one per label set
};

class metric_set {
public:
    static metric_set parse(std::string_view text);

    const metric_family* family(const std::string& name) const;
    // A counter's or gauge's value, summed over its label sets: a total (nullopt: not there).
    std::optional<double> total(const std::string& name) const;
    // The first of `names` that is there (older daemons named some metrics otherwise).
    std::optional<double> total(std::initializer_list<const char*> names) const;
    // A histogram without labels (or its first series).
    const histogram_series* histogram(const std::string& name) const;

    // {"name": value} for a family without labels, {"name": [{"labels": {...}, "value": v}, ...]}
    // with them; a histogram is {"count", "sum", "mean", "p50", "p90", "p99"} (seconds; null
    // when empty), or a list of those with "labels".
    nlohmann::json to_json() const;

private:
    std::map<std::string, metric_family> families_;
};

} // namespace tandem::cli
