// The disk cache's file access under its trust model (docs/cache.md). A cache directory holds code
// the process will run, so: nothing is opened through a symbolic link, only regular files of
// bounded size are read (a FIFO or a huge sparse file is refused, never waited on), and a
// directory or file that someone else could have written is not trusted.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <cstddef>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

namespace flashjit::detail {

// Who may have written a directory and its files for them to be trusted.
struct TrustRule {
  enum class Kind {
    private_to_user,  // owned by this user; not writable by group or others (like ~/.ssh)
    read_only_layer,  // owned by this user or root; not writable by group or others
    group_shared,     // FLASHJIT_CACHE_SHARED=1: the directory's group; not writable by others
  };
  Kind kind = Kind::private_to_user;
  gid_t group = 0;  // group_shared: the directory's group, which its files must have

  // Empty when `st` (of a directory or file) satisfies the rule, else why not.
  std::string violation(const struct stat& st, const std::filesystem::path& path) const;
};

// The rule for a cache directory: FLASHJIT_CACHE_SHARED=1 selects group sharing.
TrustRule::Kind trust_kind_for(bool read_only_layer);

struct DirectoryState {
  bool usable = false;  // exists (or was created), is a directory, and passes the rule
  bool writable = false;
  TrustRule rule;
  std::string why;  // when !usable
};
// Checks `dir` (created 0700 when `create` and missing) against the rule of `kind`.
DirectoryState check_directory(const std::filesystem::path& dir, TrustRule::Kind kind, bool create);

struct ReadResult {
  std::optional<std::string> bytes;
  bool absent = false;  // no such file: a cache miss, not an error
  std::string why;      // when the file is there but refused or unreadable
};
// Reads `path` (never following a link at its last component; regular; passing `rule`; at most
// `max_bytes`).
ReadResult read_trusted(const std::filesystem::path& path, const TrustRule& rule,
                        std::size_t max_bytes);

// A new file `temp` next to `target` holding `bytes` (created exclusively, mode 0644, fsynced).
// Returns an error message, empty on success; a failure leaves no temp file behind.
std::string write_temp(const std::filesystem::path& target, const std::string& bytes,
                       std::filesystem::path& temp);
// Replaces `target` atomically with `bytes` (write_temp + rename). Returns an error message.
std::string replace_atomically(const std::filesystem::path& target, const std::string& bytes);
// What every temp file of write_temp's name starts with.
constexpr std::string_view kTempPrefix = ".tmp.";
// Whether `name` is a temp file of write_temp's (of any process): ".tmp.<file>.<pid>.<salt>.<n>".
bool is_cache_temp_name(const std::string& name);

constexpr std::size_t kMaxMetadataBytes = std::size_t{4} << 20;  // the NVRTC log is the most
constexpr std::size_t kMaxCubinBytes = std::size_t{256} << 20;

}  // namespace flashjit::detail
