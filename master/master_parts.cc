#include "master/master_parts.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace strata::master {

proto::MasterState SaveMasterState(const MasterParts& parts, bool whole) {
  proto::MasterState st;
  parts.nodes->Save(&st);
  parts.job->Save(&st);
  parts.checkpoints->Save(&st);
  parts.tasks->Save(&st, whole);
  parts.scaler->Save(&st);
  if (whole) {
    for (std::string& e : parts.job->EventsFrom(0)) st.add_events(std::move(e));
  }
  return st;
}

proto::JobStatus MasterJobStatus(const MasterParts& parts) {
  proto::JobStatus js;
  parts.job->FillStatus(parts.nodes->View(), &js);
  parts.tasks->FillStatus(&js);
  parts.checkpoints->FillStatus(&js);
  parts.nodes->FillStatus(&js);
  parts.scaler->FillStatus(parts.nodes->View(), &js);
  js.set_pservers_registered(parts.nodes->Count(proto::PSERVER, false));
  js.set_pservers_expected(parts.expected_pservers);
  js.set_workers_registered(parts.nodes->Count(proto::WORKER, true));
  js.set_workers_expected(parts.expected_workers);
  js.set_phase(JobPhase(js, parts.nodes->placed(), parts.nodes->tables(),
                        parts.checkpoints->RestorePhase()));
  if (const auto writer = parts.nodes->AwaitedInitialValues();
      writer.has_value() && js.job_state() == proto::JOB_WAITING && parts.nodes->placed()) {
    js.set_phase(absl::StrCat("waiting for ", *writer, " to write the tables' initial values"));
  }
  js.set_security(parts.security);
  if (parts.sink->auditing()) {
    const storage::AuditHead head = parts.sink->audit_head();  // (a leaf lock)
    js.set_audit_records(head.seq);
    js.set_audit_head(head.hash);
  }
  return js;
}

proto::JobSummary MasterJobSummary(const MasterParts& parts) {
  const proto::JobStatus js = MasterJobStatus(parts);
  proto::JobSummary s = parts.job->Summary(js, parts.nodes->View());
  parts.checkpoints->FillSummary(&s);
  if (parts.checkpoints_on) s.set_resumed_from(static_cast<double>(js.resumed_from_seq()));
  parts.nodes->FillSummary(&s);
  s.set_tasks_requeued(static_cast<double>(parts.tasks->requeued()));
  s.set_records_requeued(static_cast<double>(parts.tasks->records_requeued()));
  s.set_records_done(static_cast<double>(parts.tasks->RecordsDone()));
  return s;
}

}  // namespace strata::master
