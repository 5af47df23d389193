// Checks on files the user names, made before opening them: a named pipe (FIFO), a device or a socket would block an
// open or a read forever instead of failing, so only regular files are read.
#pragma once

#include <string>
#include <string_view>

namespace hpctrain {

// Throws InputError unless `path` is an existing, readable regular file. `description` names it in the message
// ("input deck", "data file", "checkpoint", ...).
void require_regular_file(const std::string& path, std::string_view description);

}  // namespace hpctrain
