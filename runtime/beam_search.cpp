// Beam search as an engine policy (runtime/beam_search.hpp).
#include "runtime/beam_search.hpp"

#include <algorithm>
#include <cmath>

namespace tandem {
namespace {

// The score of a beam of `length` tokens (an EOS that ended it not counted).
double beam_score(const request_state& r, double sum_logprob, size_t length) {
    return sum_logprob / std::pow(double(std::max<size_t>(length, 1)), double(r.req.beam.length_penalty));
}

// The top alternatives the request asked for, from beam q's candidates.
std::vector<token_logprob> top_of(const request_state& r, const seq_state& q) {
    const size_t n = std::min(q.cand.size(), size_t(std::max(0, r.req.n_top_logprobs)));
    return {q.cand.begin(), q.cand.begin() + ptrdiff_t(n)};
}

// Whether token t after beam q completes one of the request's stop strings.
bool stops_beam(const request_state& r, const seq_state& q, token_id t) {
    if (r.req.stop.empty()) return false;
    stream_decoder dec = q.dec;
    stop_matcher stops = q.stops;
    stops.push(dec.push(t));
    return stops.stopped();
}

// Whether no live beam can beat the finished ones (Hugging Face's is_done): `best` is the
// best live beam's sum, `length` the live beams' length.
bool search_done(const request_state& r, double best, int32_t length) {
    const beam_params& bp = r.req.beam;
    if (r.finished.size() < size_t(bp.width)) return false;
    const double worst = r.finished.back().score;
    switch (bp.early_stopping) {
    case beam_params::stopping::early: return true;
    case beam_params::stopping::heuristic: return worst >= beam_score(r, best, size_t(length));
    case beam_params::stopping::never:
        return worst >= beam_score(r, best, size_t(bp.length_penalty > 0 ? r.max_tokens : length));
    }
    return false;
}

} // namespace

bool beam_search::on_row(request_state& r, seq_state& q, std::span<const float> logits, bool busy) {
    const auto history = sched_.tokens(seq_id_of(r.id, q.index));
    row_.assign(logits.begin(), logits.end());
    q.smp.process(row_, history);
    q.cand = top_logprobs(row_, std::max(2 * r.req.beam.width, r.req.n_top_logprobs));
    std::erase_if(q.cand, [](const token_logprob& t) { return !std::isfinite(t.logprob); }); // banned (a grammar)
    q.has_cand = true;
    for (const auto& b : r.seqs)
        if (b && !b->has_cand) return false;
    // A beam preempted after its row came is recomputed, perhaps in the other executor's
    // batch now: it cannot grow or fork until that batch is done (its row comes again).
    if (busy) return false;
    return step(r);
}

// A finished beam joins the best `width` ones (a worse one than all of them when they are
// full is dropped).
void beam_search::add_hypothesis(request_state& r, beam_hypothesis h) const {
    const size_t width = size_t(r.req.beam.width);
    h.score = beam_score(r, h.sum_logprob, h.tokens.size());
    auto& f = r.finished;
    const auto worse = [](const beam_hypothesis& a, const beam_hypothesis& b) { return a.score > b.score; };
    if (f.size() == width && !worse(h, f.back())) return;
    f.insert(std::upper_bound(f.begin(), f.end(), h, worse), std::move(h));
    if (f.size() > width) f.pop_back();
}

// Beam q as a finished beam.
beam_hypothesis beam_search::hypothesis_of(const request_state& r, const seq_state& q, const char* reason) const {
    beam_hypothesis h;
    const auto tokens = sched_.tokens(seq_id_of(r.id, q.index));
    h.tokens.assign(tokens.begin() + r.n_prompt, tokens.end());
    h.lps = q.lps;
    h.tops = q.tops;
    h.sum_logprob = q.sum_logprob;
    h.finish_reason = reason;
    return h;
}

// Beam q ended by token t: an EOS (kept apart, as the final token) or a stop string's.
beam_hypothesis beam_search::hypothesis_of(const request_state& r, const seq_state& q, const token_logprob& t,
                                           bool eos) const {
    beam_hypothesis h = hypothesis_of(r, q, "stop");
    h.sum_logprob += t.logprob;
    if (eos) {
        h.final_token = t.id;
        return h;
    }
    h.tokens.push_back(t.id);
    h.lps.push_back(t.logprob);
    if (r.req.n_top_logprobs > 0) h.tops.push_back(top_of(r, q));
    return h;
}

// Every live beam of r has its continuations: the best `width` extensions over all of them
// go on (ranked by their sums; ties to the earlier beam, then the likelier token). One that
// ends (EOS, a stop string) among the first `width` is finished instead; the search ends
// when max_tokens is reached or early_stopping says no live beam can do better.
bool beam_search::step(request_state& r) {
    struct extension {
        int32_t parent;
        token_logprob t;
        double sum;
    };
    std::vector<extension> all;
    for (const auto& b : r.seqs)
        if (b)
            for (size_t j = 0; j < b->cand.size() && j < size_t(2 * r.req.beam.width); ++j)
                all.push_back({b->index, b->cand[j], b->sum_logprob + b->cand[j].logprob});
    std::stable_sort(all.begin(), all.end(), [](const extension& a, const extension& b) { return a.sum > b.sum; });
    const size_t width = size_t(r.req.beam.width);
    std::vector<extension> next;
    for (size_t rank = 0; rank < all.size() && next.size() < width; ++rank) {
        const extension& e = all[rank];
        const seq_state& p = *r.seqs[size_t(e.parent)];
        const bool eos = !r.req.ignore_eos && tok_.is_eog(e.t.id);
        if (eos || stops_beam(r, p, e.t.id)) {
            if (rank < width) add_hypothesis(r, hypothesis_of(r, p, e.t, eos));
            continue;
        }
        next.push_back(e);
    }
    // Forks first (a parent's pages and state as they were), then the new tokens; beams no
    // extension came from release their pages.
    std::vector<seq_state*> beams; // [next] the beam each extension continues in
    for (const extension& e : next) {
        seq_state* parent = r.seqs[size_t(e.parent)].get();
        if (std::find(beams.begin(), beams.end(), parent) == beams.end()) {
            beams.push_back(parent);
            continue;
        }
        auto free_slot = std::find(r.seqs.begin(), r.seqs.end(), nullptr);
        if (free_slot == r.seqs.end()) free_slot = r.seqs.insert(r.seqs.end(), nullptr);
        const int32_t slot = int32_t(free_slot - r.seqs.begin());
        sched_.fork(seq_id_of(r.id, e.parent), seq_id_of(r.id, slot));
        r.seqs[size_t(slot)] = r.seqs[size_t(e.parent)]->fork(slot);
        beams.push_back(r.seqs[size_t(slot)].get());
    }
    for (size_t k = 0; k < next.size(); ++k) {
        seq_state& q = *beams[k];
        const extension& e = next[k];
        if (r.req.n_top_logprobs > 0) q.tops.push_back(top_of(r, *r.seqs[size_t(e.parent)]));
        sched_.append(seq_id_of(r.id, q.index), e.t.id);
        q.smp.accept(e.t.id);
        q.stops.push(q.dec.push(e.t.id));
        q.sum_logprob = e.sum;
        q.lps.push_back(e.t.logprob);
        ++q.n_generated;
        ++n_generated_;
    }
    for (auto& b : r.seqs)
        if (b && std::find(beams.begin(), beams.end(), b.get()) == beams.end()) {
            sched_.remove(seq_id_of(r.id, b->index));
            b.reset();
        }
    for (seq_state* q : beams) q->has_cand = false;
    if (beams.empty()) return true;
    const int32_t length = beams.front()->n_generated;
    if (length >= r.max_tokens) {
        for (seq_state* q : beams) add_hypothesis(r, hypothesis_of(r, *q, "length"));
        return true;
    }
    return search_done(r, next.front().sum, length);
}

void beam_search::end(request_state& r, const char* reason, const std::string& error) {
    for (auto& b : r.seqs)
        if (b && sched_.contains(seq_id_of(r.id, b->index))) sched_.remove(seq_id_of(r.id, b->index));
    r.seqs.clear();
    const bool searched = error.empty() && std::string_view(reason) == "stop";
    for (int32_t k = 0; k < r.req.n; ++k) {
        engine_event done;
        done.done = true;
        done.index = k;
        done.finish_reason = reason;
        done.error = error;
        if (searched && size_t(k) < r.finished.size()) {
            const beam_hypothesis& h = r.finished[size_t(k)];
            stream_decoder dec(tok_);
            stop_matcher stops(r.req.stop);
            bool cut = false;
            for (size_t j = 0; j < h.tokens.size() && !cut; ++j) {
                engine_event ev;
                ev.index = k;
                ev.id = h.tokens[j];
                ev.logprob = h.lps[j];
                if (j < h.tops.size()) ev.top = h.tops[j];
                ev.text = stops.push(dec.push(ev.id));
                ev.t = engine_clock::now();
                cut = (r.req.observer && !r.req.observer->on_token(ev)) || stops.stopped();
                r.sink(std::move(ev));
            }
            done.text = flush_text(dec, stops);
            done.finish_reason = h.finish_reason;
            done.n_generated = int32_t(h.tokens.size()) + (h.final_token >= 0 ? 1 : 0);
            done.final_token = h.final_token;
            done.score = h.score;
            done.cumulative_logprob = h.sum_logprob;
        }
        core_.queue_done(r, std::move(done));
    }
}

} // namespace tandem
