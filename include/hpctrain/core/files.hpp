// Files on disk: checks on files the user names, made before opening them (a named pipe (FIFO), a device or a socket
// would block an open or a read forever instead of failing, so only regular files are read); replacing a file so that
// a crash never leaves it half-written; and saying why a write failed in words a user can act on.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace hpctrain {

// Throws InputError unless `path` is an existing, readable regular file. `description` names it in the message
// ("input deck", "data file", "checkpoint", ...).
void require_regular_file(const std::string& path, std::string_view description);

// The temporary name a file is written under before it is committed: "FILE.partial".
std::filesystem::path partial_path(const std::filesystem::path& destination);

// Flushes a file, or a directory's entries, to disk. Throws Error naming it and the cause.
void fsync_path(const std::filesystem::path& path, bool directory);

// The commit of a file written under a temporary name in the same directory: flush it to disk, rename it to
// `destination` (replacing any file there), flush the directory. After a crash `destination` is either what it was or
// the complete new file, never a part. On failure the temporary files are removed and Error thrown.
// companions: small text files {path, text} of the same directory (pointer files that name `destination`) committed
// with it by the same directory flush: each written and flushed under its partial_path, renamed after the file.
// A crash before that flush may keep any subset of the renames; a pointer may then name a file that is not there
// (readers of pointers check that the file exists).
void commit_file(const std::filesystem::path& temporary, const std::filesystem::path& destination,
                 const std::vector<std::pair<std::filesystem::path, std::string>>& companions = {});

// Writes `destination` through write(temporary), temporary = partial_path(destination) unless given, then commits it
// (commit_file). On any failure the temporary file is removed and the error rethrown.
void write_file_atomically(const std::filesystem::path& destination,
                           const std::function<void(const std::string& temporary)>& write,
                           const std::filesystem::path& temporary = {});

// A small text file replaced atomically (write_file_atomically).
void write_text_file_atomically(const std::filesystem::path& destination, const std::string& text,
                                const std::filesystem::path& temporary = {});

// Why a write to `file` failed, for a message: "the file system is full (1.2 MiB free in DIR; the checkpoint needs
// about 3.4 MiB)", "the disk quota of DIR is exceeded (...)", "the file would pass the file-size limit (ulimit -f) of
// 400.0 KiB (...)", else `detail`. error_number: the errno the failure reported (0 when unknown: then the free space
// and the file-size limit are compared with needed_bytes). needed_bytes: about how much the write needed (0: unknown);
// needed_by names what needed it ("the checkpoint").
std::string write_failure_reason(int error_number, const std::string& detail, const std::filesystem::path& file,
                                 std::uintmax_t needed_bytes, std::string_view needed_by);

}  // namespace hpctrain
