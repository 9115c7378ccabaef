// Reasoning markers, the reply splitter and the thinking's processor (runtime/reasoning.hpp).
#include "runtime/reasoning.hpp"

#include <algorithm>
#include <limits>
#include <vector>

namespace tandem {
namespace {

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

std::string_view trim_right(std::string_view s) {
    while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
    return s;
}

// The length of the longest suffix of s that is a proper prefix of marker.
size_t partial_suffix(std::string_view s, std::string_view marker) {
    for (size_t n = std::min(s.size(), marker.size() - 1); n > 0; --n)
        if (marker.starts_with(s.substr(s.size() - n))) return n;
    return 0;
}

} // namespace

std::optional<reasoning_format> find_reasoning(std::string_view template_src, const tokenizer& tok) {
    reasoning_format f;
    const auto open = tok.find(f.open), close = tok.find(f.close);
    const bool in_template =
        template_src.find(f.open) != std::string_view::npos && template_src.find(f.close) != std::string_view::npos;
    if (!in_template && !(open && close)) return std::nullopt;
    if (open && close) {
        f.open_id = *open;
        f.close_id = *close;
    }
    f.can_disable = template_src.find("enable_thinking") != std::string_view::npos;
    return f;
}

reasoning_start start_of(const reasoning_format& f, std::string_view prompt) {
    const std::string_view p = trim_right(prompt);
    if (p.ends_with(f.close)) return reasoning_start::content;
    if (p.ends_with(f.open)) return reasoning_start::thinking;
    return reasoning_start::maybe;
}

reasoning_splitter::reasoning_splitter(const reasoning_format& f, reasoning_start start)
    : open_(f.open), close_(f.close),
      state_(start == reasoning_start::thinking  ? state::thinking
             : start == reasoning_start::content ? state::content
                                                 : state::before),
      trim_(start != reasoning_start::maybe) {}

reasoning_splitter::piece reasoning_splitter::feed(std::string_view text, bool last) {
    piece out;
    std::string buf = std::move(held_);
    held_.clear();
    buf.append(text);
    std::string_view b = buf;
    while (true) {
        if (trim_) { // just past a marker
            while (!b.empty() && is_space(b.front())) b.remove_prefix(1);
            if (b.empty()) return out;
            trim_ = false;
        }
        if (state_ == state::before) {
            std::string_view t = b;
            while (!t.empty() && is_space(t.front())) t.remove_prefix(1);
            if (t.starts_with(open_)) {
                b = t.substr(open_.size());
                state_ = state::thinking;
                trim_ = true;
                continue;
            }
            if (!last && std::string_view(open_).starts_with(t)) { // (whitespace, or the marker's start)
                held_ = std::string(b);
                return out;
            }
            state_ = state::content;
            continue;
        }
        if (state_ == state::thinking) {
            const size_t at = b.find(close_);
            if (at != std::string_view::npos) {
                out.reasoning.append(b.substr(0, at));
                b.remove_prefix(at + close_.size());
                state_ = state::content;
                trim_ = true;
                continue;
            }
            const size_t keep = last ? 0 : partial_suffix(b, close_);
            out.reasoning.append(b.substr(0, b.size() - keep));
            held_ = std::string(b.substr(b.size() - keep));
            return out;
        }
        out.content.append(b);
        return out;
    }
}

namespace {

class reasoning_processor final : public logits_processor {
public:
    reasoning_processor(token_id open, token_id close, reasoning_start start, int32_t budget,
                        std::unique_ptr<logits_processor> inner)
        : open_(open), close_(close), budget_(budget), inner_(std::move(inner)),
          state_(start == reasoning_start::thinking  ? state::thinking
                 : start == reasoning_start::content ? state::content
                                                     : state::before) {}

    std::string_view name() const override { return "reasoning"; }

    void apply(std::span<float> logits, std::span<const token_id> history) override {
        constexpr float ban = -std::numeric_limits<float>::infinity();
        const auto valid = [&](token_id t) { return t >= 0 && size_t(t) < logits.size(); };
        if (state_ == state::before) {
            if (!inner_) return;
            const float open = valid(open_) ? logits[size_t(open_)] : 0;
            inner_->apply(logits, history);
            if (valid(open_)) logits[size_t(open_)] = open; // the thinking may open
            return;
        }
        if (state_ == state::thinking) {
            if (valid(open_)) logits[size_t(open_)] = ban;
            if (budget_ >= 0 && n_thought_ >= budget_ && valid(close_)) {
                const float keep = std::max(logits[size_t(close_)], 0.0f);
                std::fill(logits.begin(), logits.end(), ban);
                logits[size_t(close_)] = keep;
            }
            return;
        }
        if (valid(open_)) logits[size_t(open_)] = ban; // thinking happens once, first
        if (inner_) inner_->apply(logits, history);
    }

    void accept(token_id t) override {
        step s;
        if (state_ == state::before) {
            if (t == open_) {
                state_ = state::thinking;
                s = step::opened;
            } else {
                state_ = state::content;
                if (inner_) inner_->accept(t);
                s = step::began_content;
            }
        } else if (state_ == state::thinking) {
            if (t == close_) {
                state_ = state::content;
                s = step::closed;
            } else {
                ++n_thought_;
                s = step::thought;
            }
        } else {
            if (inner_) inner_->accept(t);
            s = step::content;
        }
        steps_.push_back(s);
    }

    void rewind(int32_t n) override {
        for (; n > 0 && !steps_.empty(); --n) {
            const step s = steps_.back();
            steps_.pop_back();
            switch (s) {
            case step::opened: state_ = state::before; break;
            case step::thought: --n_thought_; break;
            case step::closed: state_ = state::thinking; break;
            case step::began_content:
                state_ = state::before;
                if (inner_) inner_->rewind(1);
                break;
            case step::content:
                if (inner_) inner_->rewind(1);
                break;
            }
        }
    }

    std::unique_ptr<logits_processor> clone() const override {
        auto p = std::make_unique<reasoning_processor>(open_, close_, reasoning_start::maybe, budget_,
                                                       inner_ ? inner_->clone() : nullptr);
        p->state_ = state_;
        p->n_thought_ = n_thought_;
        p->steps_ = steps_;
        return p;
    }

private:
    enum class state : uint8_t { before, thinking, content };
    enum class step : uint8_t { opened, thought, closed, began_content, content };
    token_id open_, close_;
    int32_t budget_;
    std::unique_ptr<logits_processor> inner_;
    state state_;
    int32_t n_thought_ = 0;
    std::vector<step> steps_; // what each accepted token did (rewind undoes them)
};

} // namespace

std::unique_ptr<logits_processor> make_reasoning_processor(const reasoning_format& f, reasoning_start start,
                                                           int32_t budget, std::unique_ptr<logits_processor> inner) {
    return std::make_unique<reasoning_processor>(f.open_id, f.close_id, start, budget, std::move(inner));
}

} // namespace tandem
