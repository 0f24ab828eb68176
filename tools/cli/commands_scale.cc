// strata scale: takes a running job to another number of workers
// (docs/operations.md, "Scaling"), and waits until the scale has ended.
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/proto_names.h"
#include "proto/strata.grpc.pb.h"
#include "tools/cli.h"
#include "tools/cli/commands.h"

namespace strata::tools::cli {
namespace {

constexpr char kUsage[] =
    "strata scale: usage: strata scale --master HOST:PORT [--workers N|+k|-k] "
    "[--pservers N|+k|-k] [--autoscale on|off] [--no-wait] [--timeout SECONDS] [--reason TEXT] "
    "[--json]";

// "N", "+k" or "-k" into *count; false on anything else.
bool ParseCount(const std::string& text, proto::ScaleCount* count) {
  int v = 0;
  if (text.empty()) return false;
  if (text[0] == '+' || text[0] == '-') {
    if (text.size() < 2 || !absl::ascii_isdigit(static_cast<unsigned char>(text[1])) ||
        !absl::SimpleAtoi(text, &v)) {
      return false;
    }
    count->set_by(v);
    return true;
  }
  if (!absl::SimpleAtoi(text, &v) || v < 0) return false;
  count->set_to(v);
  return true;
}

}  // namespace

CliResult Scale(const Invocation& in) {
  const Flags& f = in.flags;
  if (!f.count("master") ||
      (!f.count("workers") && !f.count("pservers") && !f.count("autoscale"))) {
    return Failure(2, kUsage);
  }
  const std::string& master = f.at("master");
  proto::ScaleRequest req;
  for (const char* role : {"workers", "pservers"}) {
    if (!f.count(role)) continue;
    proto::ScaleCount* c =
        std::string(role) == "workers" ? req.mutable_workers() : req.mutable_pservers();
    if (!ParseCount(f.at(role), c)) {
      return Failure(2, absl::StrCat("strata scale: --", role, " '", f.at(role),
                                     "': expected N (a number), +k or -k"));
    }
  }
  if (f.count("autoscale")) {
    const std::string& a = f.at("autoscale");
    if (a != "on" && a != "off") {
      return Failure(2, absl::StrCat("strata scale: --autoscale '", a, "': expected on or off"));
    }
    req.set_autoscale(a == "on" ? proto::ScaleRequest::AUTOSCALE_ON
                                : proto::ScaleRequest::AUTOSCALE_OFF);
  }
  double timeout = 600;
  if (f.count("timeout") && (!absl::SimpleAtod(f.at("timeout"), &timeout) || timeout < 0)) {
    return Failure(2, "strata scale: --timeout must be a number of seconds");
  }
  req.set_reason(FlagOr(f, "reason", "strata scale"));
  auto stub = proto::Master::NewStub(in.cluster.Channel(master));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  proto::ScaleResponse resp;
  absl::Status s = in.cluster.FromCall(stub->Scale(&ctx, req, &resp), "master " + master);
  if (!s.ok()) return Failure(1, absl::StrCat("strata scale: ", s.message()));
  if (!in.json) in.out << resp.message() << "\n" << std::flush;
  const bool something = resp.adding_size() > 0 || resp.draining_size() > 0;
  // The scale's words, as its events name it: "workers 1 -> 3: starting ...".
  const std::string what = resp.message().substr(0, resp.message().find(';'));
  std::string outcome = something ? "started" : "nothing to do";
  int code = 0;
  const absl::Time start = absl::Now();
  const bool tty = !in.json && IsTerminal(in.out);
  while (something && !f.count("no-wait")) {
    if (absl::Now() - start > absl::Seconds(timeout)) {
      if (tty) in.out << "\n";
      return Failure(1, absl::StrCat("strata scale: not done after ", timeout,
                                     " s; `strata status` shows where it stands"));
    }
    absl::SleepFor(absl::Milliseconds(250));
    auto st = in.cluster.FetchStatus(master);
    if (!st.ok()) continue;  // (a master restarting)
    std::string ended;
    for (const std::string& e : st->job().events()) {
      if (absl::StrContains(e, absl::StrCat("(", what, ")"))) ended = e;
    }
    if (absl::StrContains(ended, "scale done")) {
      outcome = "done";
    } else if (absl::StrContains(ended, "scale given up")) {
      outcome = "given up";
      code = 1;
    } else if (IsJobOver(st->job().job_state())) {
      outcome = absl::StrCat("the job ended (", st->job().state(), ")");
      code = 1;
    } else {
      if (tty) {
        in.out << absl::StrFormat("\r%s (%.0f s)", st->job().scaling(),
                                  absl::ToDoubleSeconds(absl::Now() - start))
               << std::flush;
      }
      continue;
    }
    if (tty) in.out << "\n";
    outcome = ended.empty() ? outcome : ended.substr(ended.find(' ') + 1);
    break;
  }
  CliResult r;
  r.exit_code = code;
  r.data = JsonValue::FromProto(resp);
  r.data->Set("outcome", JsonValue::String(outcome));
  r.text = [outcome, something] { return something ? outcome + "\n" : std::string(); };
  return r;
}

}  // namespace strata::tools::cli
