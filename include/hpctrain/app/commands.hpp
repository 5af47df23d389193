// The hpctrain sub-commands. Each takes the arguments after its name and returns the process exit code; errors are
// thrown (see core/error.hpp) and reported once by main.
#pragma once

#include <string>
#include <vector>

namespace hpctrain {

class MpiEnvironment;

using Arguments = std::vector<std::string>;

int train_command(const Arguments& args, const MpiEnvironment& mpi);
int data_command(const Arguments& args, const MpiEnvironment& mpi);  // data generate | inspect
int predict_command(const Arguments& args, const MpiEnvironment& mpi);
int evaluate_command(const Arguments& args, const MpiEnvironment& mpi);
int generate_command(const Arguments& args, const MpiEnvironment& mpi);    // sample from a language model
int checkpoint_command(const Arguments& args, const MpiEnvironment& mpi);  // checkpoint verify
int version_command(const MpiEnvironment& mpi);
// report: runs tools/hpctrain_report.py in place of this process (called before MPI starts); returns only by throwing.
int report_command(const Arguments& args);

}  // namespace hpctrain
