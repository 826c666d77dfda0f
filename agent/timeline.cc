#include "agent/timeline.h"

#include <algorithm>
#include <iterator>

namespace lifeline::agent {

using trace::Event;
using trace::EventType;

Timeline::Timeline(size_t saves_kept) : saves_kept_(std::max<size_t>(saves_kept, 1)) {}

void Timeline::Reset(int world, int rank_base) {
  rank_base_ = std::max(rank_base, 0);
  ranks_.assign(static_cast<size_t>(std::max(world, 0)), RankTimeline{});
  members_.clear();
  collectives_.clear();
}

void Timeline::RankExited(int rank) {
  if (rank >= 0 && rank < world()) ranks_[rank].alive = false;
}

void Timeline::MarkGap(int rank, uint64_t now_ns) {
  if (rank < 0 || rank >= world()) return;
  RankTimeline& r = ranks_[rank];
  for (auto& [comm, records] : collectives_)
    for (auto& [seq, rec] : records)
      if (static_cast<size_t>(rank) < rec.end_ns.size() && rec.begin_ns[rank] != 0 && rec.end_ns[rank] == 0)
        rec.end_ns[rank] = now_ns;
  r.open.clear();
  r.closed_early.clear();
  r.step_open = false;
  r.step_first_collective_ns = 0;
  r.last_event_ns = std::max(r.last_event_ns, now_ns);
}

int Timeline::alive_count() const {
  return static_cast<int>(std::count_if(ranks_.begin(), ranks_.end(), [](const RankTimeline& r) { return r.alive; }));
}

std::vector<int> Timeline::Members(uint32_t comm) const {
  std::vector<int> out;
  if (comm == 0) {
    for (int r = 0; r < world(); ++r) out.push_back(r);
  } else if (auto it = members_.find(comm); it != members_.end()) {
    out.assign(it->second.begin(), it->second.end());
  }
  return out;
}

const std::map<uint64_t, CollectiveRecord>* Timeline::Collectives(uint32_t comm) const {
  auto it = collectives_.find(comm);
  return it == collectives_.end() ? nullptr : &it->second;
}

CollectiveRecord* Timeline::Touch(uint32_t comm, uint64_t seq) {
  auto& records = collectives_[comm];
  auto [it, inserted] = records.try_emplace(seq);
  if (inserted) {
    it->second.begin_ns.assign(ranks_.size(), 0);
    it->second.posted_ns.assign(ranks_.size(), 0);
    it->second.end_ns.assign(ranks_.size(), 0);
    if (records.size() > kMaxSeqsPerComm) {
      const bool self = records.begin() == it;  // a seq older than all kept: forgotten at once
      records.erase(records.begin());
      if (self) return nullptr;
    }
  }
  return &it->second;
}

bool Timeline::AllLiveMembers(uint32_t comm, CollectiveRecord& rec, bool need_end) const {
  CollectiveRecord::Scan& scan = need_end ? rec.exit_scan : rec.enter_scan;
  // Whether member m is in (or out), or dead; either stays so.
  auto done = [&](int m) {
    if (!ranks_[m].alive) return true;
    if (rec.begin_ns[m] == 0 || (need_end && rec.end_ns[m] == 0)) return false;
    scan.any_live = true;
    return true;
  };
  if (comm == 0) {  // the world: no member list to build on every collective event
    for (; scan.next < world(); ++scan.next)
      if (!done(scan.next)) return false;
  } else if (auto it = members_.find(comm); it != members_.end()) {
    if (scan.members != it->second.size()) scan = CollectiveRecord::Scan{0, it->second.size(), false};
    for (auto m = it->second.lower_bound(scan.next); m != it->second.end(); ++m) {
      scan.next = *m;
      if (!done(*m)) return false;
    }
    scan.next = it->second.empty() ? 0 : *it->second.rbegin() + 1;
  }
  return scan.any_live;
}

void Timeline::AddSave(RankTimeline* r, CheckpointSave save) {
  if (!r->saves.empty()) {
    const CheckpointSave& prev = r->saves.back();
    if (save.begin_ns <= prev.begin_ns) return;  // out of order: cannot place it
    save.interval_ns = save.begin_ns - prev.begin_ns;
  }
  r->saves.push_back(save);
  while (r->saves.size() > saves_kept_) r->saves.pop_front();
}

TimelineChange Timeline::Apply(int rank, const Event& e) {
  TimelineChange change;
  if (rank < 0 || rank >= world()) return change;
  change.rank = rank;
  change.event = &e;
  RankTimeline& r = ranks_[rank];
  r.last_event_ns = std::max(r.last_event_ns, e.time_ns);
  ++r.events;
  auto find_save = [&r](uint64_t step) {
    return std::find_if(r.saves.rbegin(), r.saves.rend(), [step](const CheckpointSave& s) { return s.step == step; });
  };
  switch (e.type) {
    case EventType::kProcessStart:
      r.started = true;
      r.resumed_from = e.step;
      r.resumed_source = e.seq <= 2 ? static_cast<trace::ResumeSource>(e.seq) : trace::ResumeSource::kUnknown;
      break;
    case EventType::kProcessExit:
      r.finished = true;
      r.step_open = false;
      break;
    case EventType::kStepBegin:
      r.step = e.step;
      if (!r.began_step) r.first_step = e.step;
      r.began_step = true;
      r.step_open = true;
      r.step_begin_ns = e.time_ns;
      r.step_first_collective_ns = 0;
      break;
    case EventType::kStepEnd:
      if (r.step_open && e.time_ns >= r.step_begin_ns) change.step_closed_ns = e.time_ns - r.step_begin_ns;
      r.step_open = false;
      break;
    case EventType::kCollectiveBegin: {
      if (e.comm != 0) members_[e.comm].insert(rank);
      uint64_t& last = r.last_begun[e.comm];
      last = std::max(last, e.seq);
      auto& open = r.open[e.comm];
      open[e.seq] = OpenCollective{e.time_ns, e.op, e.step, false};
      while (open.size() > kMaxSeqsPerComm) open.erase(open.begin());
      if (auto early = r.closed_early.find(e.comm); early != r.closed_early.end()) early->second.erase(e.seq);
      if (r.step_open && r.step_first_collective_ns == 0 && e.time_ns >= r.step_begin_ns) {
        r.step_first_collective_ns = e.time_ns;
        change.first_collective_of_step = true;
      }
      CollectiveRecord* rec = Touch(e.comm, e.seq);
      if (rec == nullptr) break;
      if (rec->begun == 0) {
        rec->op = e.op;
        rec->step = e.step;
      }
      change.first_begin = rec->begin_ns[rank] == 0 && e.time_ns != 0;
      if (change.first_begin) ++rec->begun;
      rec->begin_ns[rank] = e.time_ns;
      if (!rec->entered_by_all && AllLiveMembers(e.comm, *rec, /*need_end=*/false))
        rec->entered_by_all = change.entered_by_all = true;
      change.record = rec;
      break;
    }
    case EventType::kCollectivePosted: {
      if (auto comm = r.open.find(e.comm); comm != r.open.end())
        if (auto it = comm->second.find(e.seq); it != comm->second.end()) it->second.posted = true;
      CollectiveRecord* rec = Touch(e.comm, e.seq);
      if (rec != nullptr) rec->posted_ns[rank] = e.time_ns;
      change.record = rec;
      break;
    }
    case EventType::kCollectiveEnd: {
      if (auto comm = r.open.find(e.comm); comm != r.open.end()) {
        if (auto it = comm->second.find(e.seq); it != comm->second.end()) {
          change.collective_closed = it->second;
          if (it != comm->second.begin()) {
            auto& early = r.closed_early[e.comm];
            early.insert(comm->second.begin(), it);
            while (early.size() > kMaxSeqsPerComm) early.erase(early.begin());
          }
          comm->second.erase(comm->second.begin(), std::next(it));
        }
      }
      if (!change.collective_closed) {
        if (auto early = r.closed_early.find(e.comm); early != r.closed_early.end()) {
          if (auto late = early->second.find(e.seq); late != early->second.end()) {
            change.collective_closed = late->second;
            change.closed_early = true;
            early->second.erase(late);
          }
        }
      }
      CollectiveRecord* rec = Touch(e.comm, e.seq);
      if (rec == nullptr) break;
      rec->end_ns[rank] = e.time_ns;
      if (!rec->exited_by_all && AllLiveMembers(e.comm, *rec, /*need_end=*/true))
        rec->exited_by_all = change.exited_by_all = true;
      change.record = rec;
      break;
    }
    case EventType::kCheckpointBegin:
      if (find_save(e.step) == r.saves.rend()) AddSave(&r, CheckpointSave{e.step, e.time_ns, 0, 0});
      break;
    case EventType::kCheckpointPersisted: {
      if (r.persisted_step == trace::kNoStep || e.step > r.persisted_step) r.persisted_step = e.step;
      if (r.failed_save_step != trace::kNoStep && e.step >= r.failed_save_step) r.failed_save_step = trace::kNoStep;
      r.save_failure_code = 0;
      auto it = find_save(e.step);
      if (it != r.saves.rend()) {
        if (it->persisted_ns == 0) it->persisted_ns = std::max(e.time_ns, it->begin_ns);
      } else if (e.duration_ns > 0 && e.time_ns > e.duration_ns) {
        // A streamed save records no begin: place it by its duration.
        AddSave(&r, CheckpointSave{e.step, e.time_ns - e.duration_ns, e.time_ns, 0});
      }
      break;
    }
    case EventType::kCheckpointFailed: {
      r.save_failure_code = e.aux;
      if (r.persisted_step == trace::kNoStep || e.step > r.persisted_step) {
        r.failed_save_step = e.step;
        r.failed_save_code = e.aux;
      }
      auto it = find_save(e.step);
      if (it != r.saves.rend() && it->persisted_ns == 0) r.saves.erase(std::next(it).base());
      break;
    }
    case EventType::kCheckpointCommitted:
      if (r.committed_step == trace::kNoStep || e.step > r.committed_step) r.committed_step = e.step;
      break;
    default:
      break;
  }
  return change;
}

}  // namespace lifeline::agent
