// The start plan, agreed; the resume with fallback over damaged checkpoints.
#include "hpctrain/train/resume.hpp"

#include <sstream>

#include "hpctrain/core/error.hpp"

namespace hpctrain {

namespace fs = std::filesystem;

StartPlan agree_start_plan(const RunConfig& config, const MpiEnvironment& mpi, const std::string& resume, bool force) {
  StartPlan plan;
  run_on_root(mpi, [&] {
    plan = plan_start(inspect_run_directory(config.run.output), resume, force, config.where("run.output"));
  });
  std::string candidates;
  for (const fs::path& candidate : plan.candidates) candidates += candidate.string() + '\n';
  broadcast_string(mpi, plan.run_id);
  broadcast_string(mpi, plan.note);
  broadcast_string(mpi, candidates);
  plan.candidates.clear();
  std::stringstream lines(candidates);
  for (std::string line; std::getline(lines, line);) plan.candidates.emplace_back(line);
  return plan;
}

ResumedRun resume_from(const StartPlan& plan, Model& model, Optimizer& optimizer, Backend& backend,
                       const MpiEnvironment& mpi, const fs::path& config_path) {
  ResumedRun run;
  for (const fs::path& candidate : plan.candidates) {
    std::string problem;
    bool mismatch = false;
    const double load_start = MPI_Wtime();
    try {
      load_checkpoint(candidate.string(), model, optimizer, backend, run.state, mpi);
    } catch (const CheckpointMismatch& error) {
      problem = error.what();
      mismatch = true;
    } catch (const CheckpointDamaged& error) {
      problem = error.what();
    }
    // Every rank reads the same file, so they fail alike; agree anyway so no rank goes on alone.
    int outcome[2] = {problem.empty() ? 0 : 1, mismatch ? 1 : 0};
    HPCTRAIN_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, outcome, 2, MPI_INT, MPI_MAX, mpi.world()));
    if (outcome[0] != 0) {
      if (problem.empty()) problem = "checkpoint '" + candidate.string() + "': another rank could not load it";
      if (outcome[1] != 0)
        throw InputError(problem, "resume with the deck the checkpoint was written with (" + config_path.string() +
                                      ", or the checkpoint's 'deck' attribute)");
      run.passed_over.push_back(problem);
      continue;
    }
    run.resumed = true;
    run.from = candidate;
    run.read_seconds = MPI_Wtime() - load_start;
    return run;
  }
  if (plan.candidates.empty()) return run;  // a fresh start
  std::string listed;
  for (const std::string& failure : run.passed_over) listed += "\n  " + failure;
  throw InputError("no usable checkpoint to resume from:" + listed,
                   "start a fresh run in another directory (--output DIR, without --resume) or point --resume at a "
                   "sound checkpoint");
}

}  // namespace hpctrain
