// `hpctrain data convert`: an HDF5 data file from NumPy .npy arrays or a CSV file, written by rank 0.
#include <cstdio>

#include "data_tools.hpp"
#include "hpctrain/app/command_line.hpp"
#include "hpctrain/core/error.hpp"
#include "hpctrain/data/convert.hpp"
#include "hpctrain/data/tokens.hpp"
#include "hpctrain/dist/mpi_environment.hpp"

namespace hpctrain {

namespace {

const char* const convert_usage =
    "usage: hpctrain data convert --features X.npy (--labels Y.npy | --targets T.npy) --output FILE.h5 [options]\n"
    "       hpctrain data convert --csv FILE.csv (--label-column COL | --target-column COL) [--header]\n"
    "                             --output FILE.h5 [options]\n"
    "       hpctrain data convert --text FILE... --output FILE.h5 [--validation-fraction F\n"
    "                             --validation-output V.h5] [--sequence-length T] [options]\n"
    "       hpctrain data convert --tokens IDS.npy --vocabulary V --output FILE.h5 [...as for --text]\n"
    "\n"
    "Write an HDF5 data file in hpctrain's layout from NumPy .npy arrays or a CSV file of numbers, or a token file\n"
    "(a 1-D /tokens stream for language models, docs/file-formats.md) from text or token ids.\n"
    "\n"
    ".npy: the features keep their element type (float16/32/64, int8..64, uint8..64) and shape (N, ...); labels\n"
    "(N) or (N, 1) whole numbers become /labels int32; targets (N) or (N, K) become /targets float32. C order only.\n"
    "CSV: comma-separated numbers, one sample per line; the chosen column becomes /labels (N) int32 (whole numbers)\n"
    "or /targets (N, 1) float32, every other column /features (N, F) float32. Empty lines are skipped.\n"
    "\n"
    "options:\n"
    "  --features X.npy        features, shape (N, ...) with at least 2 dimensions\n"
    "  --labels Y.npy          class labels\n"
    "  --targets T.npy         regression targets\n"
    "  --csv FILE.csv          a CSV file instead of .npy arrays\n"
    "  --label-column COL      CSV: the class label column, by header name or index counted from 0 (-1 = last)\n"
    "  --target-column COL     CSV: a regression target column instead\n"
    "  --header                CSV: the first line names the columns\n"
    "  --text FILE...          text files, byte-level (one token per byte, vocabulary 256), concatenated in order\n"
    "  --tokens IDS.npy        integer token ids from any tokenizer (any shape, read flattened in C order)\n"
    "  --vocabulary V          --tokens: the tokenizer's vocabulary size; every id must lie in [0, V)\n"
    "  --validation-fraction F token data: the last round(F x tokens) tokens go to --validation-output (0 <= F < 1)\n"
    "  --validation-output V.h5  the validation token file (required with F > 0)\n"
    "  --sequence-length T     token data: record T (the tokens of one sample) as the files' default\n"
    "  --output FILE.h5        file to write (required); written as FILE.h5.partial and renamed when complete\n"
    "  --compress              gzip level 4 with the shuffle filter (smaller files, slower random reads)\n"
    "  --force                 replace FILE.h5 if it exists\n"
    "\n"
    "Uncompressed datasets are stored contiguously, large ones on 2 MiB boundaries (fast random reads); with\n"
    "--compress, or from a CSV, datasets are chunked along the sample axis in chunks of about 1 MiB of whole\n"
    "samples. Token ids are stored as uint8 for a vocabulary up to 256, uint16 up to 65,536, int32 above.\n";

// --text / --tokens: a token file, and a validation token file with --validation-fraction.
int convert_token_data(const CommandLine& parsed, const MpiEnvironment& mpi) {
  const std::string& command = parsed.command();
  const std::string help_hint = parsed.help_hint();
  for (const char* option :
       {"--features", "--labels", "--targets", "--csv", "--label-column", "--target-column", "--header"})
    HPCTRAIN_VERIFY(!parsed.has(option), InputError, command << ": " << option << " is not for token data", help_hint);
  TokenConversion conversion;
  if (parsed.has("--text")) {
    HPCTRAIN_VERIFY(!parsed.has("--tokens"), InputError, command << ": give --text or --tokens, not both", help_hint);
    HPCTRAIN_VERIFY(!parsed.has("--vocabulary"), InputError,
                    command << ": --vocabulary is for --tokens (byte-level text has a vocabulary of 256)", help_hint);
    conversion.texts = parsed.values("--text");
    conversion.texts.insert(conversion.texts.end(), parsed.positionals().begin(), parsed.positionals().end());
  } else {
    HPCTRAIN_VERIFY(parsed.has("--vocabulary"), InputError,
                    command << ": --tokens needs --vocabulary V, the tokenizer's vocabulary size", help_hint);
    conversion.ids = parsed.value("--tokens");
    conversion.vocabulary = parsed.integer<std::int64_t>("--vocabulary");
  }
  if (parsed.has("--sequence-length")) {
    conversion.sequence_length = parsed.integer<std::int64_t>("--sequence-length");
    HPCTRAIN_VERIFY(conversion.sequence_length >= 1, InputError, command << ": --sequence-length must be >= 1",
                    help_hint);
  }
  if (parsed.has("--validation-fraction")) conversion.validation_fraction = parsed.number("--validation-fraction");
  const bool validation = conversion.validation_fraction != 0;
  HPCTRAIN_VERIFY(validation == parsed.has("--validation-output"), InputError,
                  command << ": "
                          << (validation ? "--validation-fraction needs --validation-output V.h5"
                                         : "--validation-output needs --validation-fraction F > 0"),
                  help_hint);
  conversion.compress = parsed.has("--compress");
  const std::string output = parsed.value("--output");
  const std::string validation_output = validation ? parsed.value("--validation-output") : "";
  HPCTRAIN_VERIFY(output != validation_output, InputError,
                  command << ": --output and --validation-output must be two different files", help_hint);
  if (mpi.is_root()) {
    std::string summary;
    const auto convert = [&](const std::string& train, const std::string& held_out) {
      summary = with_command_context(command, [&] { return convert_tokens(conversion, train, held_out); });
    };
    write_output_file(parsed, "--output", output, [&](const std::string& train) {
      if (!validation) return convert(train, "");
      write_output_file(parsed, "--validation-output", validation_output,
                        [&](const std::string& held_out) { convert(train, held_out); });
    });
    summary = naming_outputs(
        summary, validation ? std::vector<std::string>{output, validation_output} : std::vector<std::string>{output});
    std::printf("%s\n", summary.c_str());
    std::fflush(stdout);
  }
  wait_for_root(mpi);
  return 0;
}

}  // namespace

int data_convert_command(const Arguments& args, const MpiEnvironment& mpi) {
  const std::string command = "hpctrain data convert";
  const CommandLine parsed(args, command,
                           {{"--features", true},
                            {"--labels", true},
                            {"--targets", true},
                            {"--csv", true},
                            {"--label-column", true},
                            {"--target-column", true},
                            {"--header", false},
                            {"--text", true, true},
                            {"--tokens", true},
                            {"--vocabulary", true},
                            {"--validation-fraction", true},
                            {"--validation-output", true},
                            {"--sequence-length", true},
                            {"--output", true},
                            {"--compress", false},
                            {"--force", false}});
  if (print_help_if_asked(parsed, convert_usage, mpi)) return 0;
  const std::string help_hint = parsed.help_hint();
  const bool text = parsed.has("--text");
  // --text a.txt b.txt: the files after the first arrive as positionals.
  HPCTRAIN_VERIFY(text || parsed.positionals().empty(), InputError,
                  command << ": unexpected argument '" << parsed.positionals()[0] << "'", help_hint);
  HPCTRAIN_VERIFY(parsed.has("--output"), InputError, command << ": --output FILE.h5 is required", help_hint);
  if (text || parsed.has("--tokens")) return convert_token_data(parsed, mpi);
  for (const char* option : {"--vocabulary", "--validation-fraction", "--validation-output", "--sequence-length"})
    HPCTRAIN_VERIFY(!parsed.has(option), InputError, command << ": " << option << " is for --text or --tokens input",
                    help_hint);
  const bool csv = parsed.has("--csv");
  if (csv) {
    for (const char* option : {"--features", "--labels", "--targets"})
      HPCTRAIN_VERIFY(!parsed.has(option), InputError, command << ": " << option << " is for .npy input, not --csv",
                      help_hint);
    HPCTRAIN_VERIFY(parsed.has("--label-column") != parsed.has("--target-column"), InputError,
                    command << ": --csv needs exactly one of --label-column and --target-column", help_hint);
  } else {
    HPCTRAIN_VERIFY(parsed.has("--features"), InputError,
                    command << ": give --features X.npy with --labels or --targets, or --csv FILE.csv", help_hint);
    HPCTRAIN_VERIFY(parsed.has("--labels") != parsed.has("--targets"), InputError,
                    command << ": give exactly one of --labels Y.npy and --targets T.npy", help_hint);
    for (const char* option : {"--label-column", "--target-column", "--header"})
      HPCTRAIN_VERIFY(!parsed.has(option), InputError, command << ": " << option << " is for --csv input", help_hint);
  }
  const std::string output = parsed.value("--output");
  const bool compress = parsed.has("--compress");
  if (mpi.is_root()) {
    std::string summary;
    write_output_file(parsed, "--output", output, [&](const std::string& partial) {
      summary = with_command_context(command, [&] {
        if (csv) {
          CsvConversion conversion;
          conversion.csv = parsed.value("--csv");
          conversion.targets = parsed.has("--target-column");
          conversion.label_column = parsed.value(conversion.targets ? "--target-column" : "--label-column");
          conversion.header = parsed.has("--header");
          conversion.compress = compress;
          return convert_csv(conversion, partial);
        }
        NpyConversion conversion;
        conversion.features = parsed.value("--features");
        conversion.answers_are_labels = parsed.has("--labels");
        conversion.answers = parsed.value(conversion.answers_are_labels ? "--labels" : "--targets");
        conversion.compress = compress;
        return convert_npy(conversion, partial);
      });
    });
    summary = naming_outputs(summary, {output});
    std::printf("%s\n", summary.c_str());
    std::fflush(stdout);
  }
  wait_for_root(mpi);
  return 0;
}

}  // namespace hpctrain
