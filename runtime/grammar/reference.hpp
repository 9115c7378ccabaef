// The reference matcher: an Earley recognizer over a compiled grammar's bytes, with no caches
// and no shortcuts. It is the spec the fast matcher (matcher.hpp) and the token masks are
// tested against, and what tests use to ask whether a grammar accepts a text.
#pragma once

#include "runtime/grammar/grammar.hpp"

#include <cstdint>
#include <string_view>
#include <vector>

namespace tandem::grammar {

class reference_matcher {
public:
    explicit reference_matcher(const compiled& g);

    // Consumes bytes when they extend what was fed to a prefix of some text of the grammar;
    // otherwise returns false and the state is unchanged.
    bool feed(std::string_view bytes);
    // What was fed is a whole text of the grammar.
    bool can_end() const;
    // What was fed so far, and whether `bytes` after it would still be a prefix.
    bool can_feed(std::string_view bytes) const;

private:
    struct item {
        uint32_t pos;    // position in g.elems (the element after the dot)
        uint32_t origin; // the set where the item's rule started
        uint32_t rule;
        bool operator==(const item&) const = default;
    };
    bool scan(uint8_t byte) const;
    void close(size_t set) const; // prediction and completion over sets_[set]
    const compiled* g_;
    std::vector<bool> nullable_; // per rule: matches the empty text
    mutable std::vector<std::vector<item>> sets_; // can_feed() adds sets and takes them back
};

// Whether the grammar produces exactly `text`, and whether `text` begins one of its texts.
bool matches(const compiled& g, std::string_view text);
bool is_prefix(const compiled& g, std::string_view text);

} // namespace tandem::grammar
