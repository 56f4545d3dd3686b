// holdfast/kv/filesystem.hpp — a kv_store in a directory that every worker can see: local disk
// for the processes of one host, NFS, Lustre or a FUSE mount for several hosts.
//
// One file per key, published with holdfast/publish.hpp and awaited with holdfast/wait.hpp:
//   insert = publish_once (renameat2 RENAME_NOREPLACE, or link + unlink), put = publish
//   (rename over), get = await_file with the Wait policy, list = a scan of the namespace's
//   directory and of the matching parent directories.
// Layout: one directory per parent prefix less its last segment, so that a watch sees only its
//   own keys' writes and a protocol's rounds share their directories. Names are escaped: bytes
//   other than A-Z a-z 0-9 - _ . (and a leading '.') become %XX.
//   - A key with two or more '/' lives in `<root>/<run id>/<incarnation>/<escaped prefix up to
//     its second-to-last '/'>/<escaped rest>`: "h/run/ack/r0/3" is the file "r0%2F3" in the
//     directory "h%2Frun%2Fack%2F", and "h/run/ctl/r0/step" the file "r0%2Fstep" in
//     "h%2Frun%2Fctl%2F": every round's acks in one directory, every round's control keys in
//     another. A key with one '/' lives in its parent's directory: "acks/3" is the file "3" in
//     "acks%2F". A directory name always ends with "%2F" (an escaped '/'), so it never collides
//     with a key's file. (Before issue 32, item 11, the directory was the whole parent,
//     "ack%2Fr0%2F/3": one directory made and removed per round.)
//   - A key without '/' is a file in the namespace directory itself: "stop" is ".../stop".
//   A parent directory is made by the first write below it: a put makes it (mkdir), an insert
//   stages it in `.tmp` holding its key and renames it into place without replacing, so a
//   watch sees one event for a new directory's first key, not an empty directory and then the
//   key. An erase keeps it (the next round's keys go there); erase_prefix removes the ones it
//   empties (rmdir, best effort). A write that finds it gone (removed meanwhile) makes it again
//   and writes again.
//   - Writes make their temps in `.tmp` under the namespace directory and rename them into
//     place, so a key's directory sees one event per write: the rename.
//
// Guarantees:
//   - insert is exclusive across threads, processes and hosts sharing the directory (as
//     exclusive as the filesystem's rename-noreplace or link: atomic on local filesystems and
//     NFS).
//   - A reader sees a value whole (old or new), never a partial write.
//   - get wakes on the insert (inotify_wait: an inotify watch on the namespace directory, with a
//     re-check every 500 ms for changes made by other NFS hosts) or polls with back-off up to
//     100 ms (poll_wait, for network filesystems); either way it returns by the deadline.
//   - Files that are not escaped keys (publish temps ".holdfast-tmp.*", anything starting with
//     '.', names that do not decode, a name with an escaped '/' outside a parent directory) are
//     ignored by list, erase_prefix and watch.
//   - An agreement round after the first makes no directory and creates one file per key it
//     writes (each worker's ack, the claim, the step); the acks' writes and erases never wake a
//     watch on the control keys, and the handler's writes-only watches sleep through the
//     erases of the last round's keys: two wake-ups per worker but the claimant (the claim, the
//     step) (issue 32, item 11; counted by benchmarks/fs_agreement_bench.cpp).
//   - watch(prefix) (has_kv_watch_v) keeps one inotify descriptor for its life, with a watch on
//     the namespace directory (keys without '/', parent directories appearing) and one on each
//     parent directory that can hold keys below the prefix (added as they appear). Writes to
//     other parents never wake it: a watch on "h/run/ctl" sleeps through every "h/run/ack/..."
//     write. It wakes on a key below the prefix created, renamed in (publish), written, renamed
//     away or removed (a directory's other keys wake it, and are not reported), and on such a
//     parent directory made or removed (watch(prefix, kv_watch_events::writes): not on a key
//     erased or renamed away); take() then reports resync, never
//     events (a name carries no value: the caller re-reads its keys, a local list). The first
//     take, an inotify queue overflow and a lost watch (the directory removed or moved:
//     re-added once it is back) are resyncs too.
//   - A watch re-checks (due() finite, resync at each) every watch_recheck (500 ms for
//     filesystem_kv, 100 ms for network_filesystem_kv) unless the directory's filesystem is one
//     whose changes inotify always sees (fstatfs: ext2/3/4, xfs, btrfs, tmpfs, overlayfs), where
//     due() is time_point::max() and an idle watch never wakes; network_filesystem_kv always
//     re-checks. Without inotify (inotify_init1 failing, or no watch left: ENOSPC) fd() is -1
//     and the watch polls every watch_poll_interval (100 ms), adding the watch when it can; a
//     parent directory it could not watch makes it poll at that interval too, until it can.
// Caveats:
//   - A key becomes at most two names: an escaped directory prefix (with its '/') or an
//     escaped rest longer than 255 bytes is refused with ENAMETOOLONG.
//   - The directories a job's keys have used stay until erase_prefix empties them (one per
//     distinct prefix: a handful for the agreement's keys, however many rounds).
//   - The default Durability is `no_sync`: keys are coordination state of one incarnation and
//     need to be visible, not to survive a power loss. Choose `durable` to make them survive.
//   - A writer killed mid-publish leaves a ".holdfast-tmp.*" temp in `.tmp`; remove old ones
//     with kv.sweep_stale_temps(age) (`.tmp`, the namespace directory and every parent
//     directory, where earlier versions made them).
//   - erase and erase_prefix are not atomic across keys (one unlink per key).
//   - inotify does not see changes other NFS hosts make: on NFS and other network or unknown
//     filesystems a watch learns of them at its next re-check only (up to watch_recheck late).
//   - get keeps await_file's behaviour: one inotify descriptor per wait that finds the key
//     missing (a watch keeps one for its life instead). A get waiting in a parent directory
//     that an erase_prefix removes meanwhile (it removes the directories it empties, which
//     other prefixes' keys may share: "a/x/y" and "a/b/c" both live in "a%2F") learns of a
//     later insert at its next re-check (500 ms).
#pragma once

#include <fcntl.h>
#include <linux/magic.h>  // f_type values of the local filesystems a watch trusts
#include <sys/inotify.h>  // the watch's descriptor
#include <sys/stat.h>     // lstat: a parent directory exists; a staging directory's age
#include <sys/statfs.h>   // fstatfs: is the namespace directory on a local filesystem

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#include "../detail/ascii.hpp"  // hex_digit: escaped file names
#include "../error.hpp"
#include "../io.hpp"
#include "../kv.hpp"
#include "../publish.hpp"
#include "../wait.hpp"

HOLDFAST_NAMESPACE_BEGIN

namespace detail {

/// One key (or namespace part) as one file name: [A-Za-z0-9_.-] kept (not a leading '.'),
/// every other byte %XX (upper-case hex).
inline std::string fs_escape(std::string_view key) {
  static constexpr char hex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(key.size());
  for (std::size_t i = 0; i < key.size(); ++i) {
    const auto c = static_cast<unsigned char>(key[i]);
    const bool plain = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                       c == '-' || c == '_' || (c == '.' && i > 0);
    if (plain) {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

/// True when one of two key prefixes starts with the other: a parent directory standing for
/// `parent` can hold keys that start with `start`.
inline bool fs_prefixes_overlap(std::string_view parent, std::string_view start) {
  const std::size_t n = std::min(parent.size(), start.size());
  return parent.compare(0, n, start.substr(0, n)) == 0;
}

/// The key a file name stands for, or std::nullopt when the name is not fs_escape's output.
inline std::optional<std::string> fs_unescape(std::string_view name) {
  auto digit = [](char c) { return hex_digit(c, hex_case::upper); };
  std::string out;
  out.reserve(name.size());
  for (std::size_t i = 0; i < name.size(); ++i) {
    if (name[i] != '%') {
      out += name[i];
      continue;
    }
    if (i + 2 >= name.size()) return std::nullopt;
    int hi = digit(name[i + 1]), lo = digit(name[i + 2]);
    if (hi < 0 || lo < 0) return std::nullopt;
    out += static_cast<char>(hi * 16 + lo);
    i += 2;
  }
  if (fs_escape(out) != name) return std::nullopt;  // only canonical names are keys
  return out;
}

/// True for the statfs f_type of a filesystem whose every change is made by this kernel, so
/// inotify sees it: ext2/3/4, xfs, btrfs, tmpfs, overlayfs. Anything else (NFS, Lustre, FUSE,
/// unknown) may change behind inotify's back.
constexpr bool fs_notifies_all(std::uint64_t f_type) noexcept {
  switch (static_cast<std::uint32_t>(f_type)) {  // f_type is a signed long: compare 32 bits
    case EXT4_SUPER_MAGIC:                       // also ext2 and ext3 (one magic)
    case XFS_SUPER_MAGIC:
    case BTRFS_SUPER_MAGIC:
    case TMPFS_MAGIC:
    case OVERLAYFS_SUPER_MAGIC:
      return true;
    default:
      return false;
  }
}

/// The statfs f_type of directory `dir` (see detail::filesystem_type); 0 when unknown.
template <class Io>
std::uint64_t fs_type_of(const std::string& dir) noexcept {
  int fd = Io::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
  if (fd < 0) return 0;
  const std::uint64_t type = filesystem_type<Io>(fd);
  Io::close(fd);
  return type;
}

template <class W>
using fs_wait_recheck = decltype(W::recheck);

/// The Wait policy's re-check interval: W::recheck, or W::max_interval for a policy without.
template <class W>
constexpr std::chrono::milliseconds fs_recheck() noexcept {
  if constexpr (detect<fs_wait_recheck, W>::value)
    return std::chrono::milliseconds(W::recheck);
  else
    return std::chrono::milliseconds(W::max_interval);
}

/// True for the name of a parent directory in a filesystem_kv namespace (see the layout): an
/// escaped prefix ending with an escaped '/'.
inline bool fs_is_parent_name(std::string_view name) noexcept {
  return name.size() > 3 && name.compare(name.size() - 3, 3, "%2F") == 0;
}

/// A watch on the keys below one prefix of a filesystem_kv namespace directory (see
/// basic_filesystem_kv::watch): one inotify descriptor for its life, with a watch on the
/// namespace directory and one on each parent directory that can hold keys below the prefix
/// (below it, or above it: "h%2F" for a watch of "h/run/ctl").
template <class Io>
class fs_watch {
 public:
  /// The clock of due().
  using clock = std::chrono::steady_clock;

  /// Follows the keys of `dir` that start with `start` ("" for all). `recheck`: the re-check
  /// interval where inotify may miss changes; `poll`: the interval without inotify;
  /// `trust_local`: no re-check on a filesystem fs_notifies_all accepts.
  /// `events`: kv_watch_events::writes leaves erases out of the parent directories' inotify
  /// mask (and ignores those of keys without '/'), so a key's erase does not wake it.
  fs_watch(std::string dir, std::string start, std::chrono::milliseconds recheck,
           std::chrono::milliseconds poll, bool trust_local,
           kv_watch_events events = kv_watch_events::all)
      : dir_(std::move(dir)),
        start_(std::move(start)),
        recheck_(recheck),
        poll_(poll),
        trust_local_(trust_local),
        writes_only_(events == kv_watch_events::writes),
        due_(clock::now()) {
    int raw = Io::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (raw >= 0) {
      inotify_ = basic_fd<Io>(raw, "inotify");
      add_watch();
    }
  }

  /// The inotify descriptor to poll() for POLLIN; -1 while the namespace directory has no
  /// inotify watch (inotify unavailable, or the directory gone): then wake at due() only.
  int fd() const noexcept { return wd_ >= 0 ? inotify_.get() : -1; }
  /// True until the first take(), whose resync is already known.
  bool buffered() const noexcept { return pending_; }
  /// When take() must be called although fd() is quiet: at once before the first take; then
  /// time_point::max() on a trusted local filesystem, else the last resync plus the re-check
  /// interval (or the poll interval while a directory could not be watched).
  clock::time_point due() const noexcept { return due_; }
  /// Drains the descriptor without blocking; resync when a key below the prefix was created,
  /// replaced, written or removed (not removed for a writes-only watch), or such a parent
  /// directory made or removed, on the first
  /// take, on an inotify queue overflow, when a watch was lost or re-established, and when
  /// due() has passed. Never events: the caller re-reads its keys (a local list or try_get).
  kv_changes take() {
    kv_changes c;
    c.resync = std::exchange(pending_, false);
    if (inotify_) {
      if (drain()) c.resync = true;
      if (wd_ < 0 && add_watch()) c.resync = true;  // changes while unwatched are unknown
      if (wd_ >= 0 && unwatched_ && watch_parents()) c.resync = true;
    }
    const auto now = clock::now();
    if (now >= due_) c.resync = true;
    if (c.resync) {
      const auto every = wd_ >= 0 && !unwatched_ ? interval_ : std::chrono::milliseconds(poll_);
      due_ = every == std::chrono::milliseconds::max() ? clock::time_point::max() : now + every;
    }
    return c;
  }

 private:
  static constexpr std::uint32_t mask = IN_CREATE | IN_MOVED_TO | IN_CLOSE_WRITE | IN_DELETE |
                                        IN_MOVED_FROM | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR;

  // Watches the namespace directory (again) and the parent directories below the prefix;
  // fixes the re-check interval from the filesystem.
  bool add_watch() {
    parents_.clear();
    wd_ = Io::inotify_add_watch(inotify_.get(), dir_.c_str(), mask);
    if (wd_ < 0) return false;
    interval_ = trust_local_ && fs_notifies_all(fs_type_of<Io>(dir_))
                    ? std::chrono::milliseconds::max()
                    : recheck_;
    watch_parents();
    return true;
  }

  // Adds a watch on every parent directory below the prefix not watched yet; true when it added
  // one. unwatched_ says whether one could not be watched (the scan failed, or no watch left).
  bool watch_parents() {
    std::vector<std::string> names;
    try {
      names = list_directory<Io>(dir_);
    } catch (const std::exception&) {  // retried at the poll interval (unwatched_)
      unwatched_ = true;
      return false;
    }
    unwatched_ = false;
    bool added = false;
    for (const auto& name : names) {
      auto parent = below(name.c_str());
      if (!parent) continue;
      const std::size_t before = parents_.size();
      if (!watch_parent(name.c_str(), std::move(*parent))) unwatched_ = true;
      added = added || parents_.size() > before;
    }
    return added;
  }

  // The prefix a parent directory's name stands for ("ack/"), when it can hold keys below the
  // prefix (the prefix is below it, or it below the prefix).
  std::optional<std::string> below(const char* name) const {
    if (name[0] == '.' || !fs_is_parent_name(name)) return std::nullopt;
    auto parent = fs_unescape(name);
    if (!parent || !fs_prefixes_overlap(*parent, start_)) return std::nullopt;
    return parent;
  }

  // Watches parent directory `name` (standing for `parent`) unless it is watched already.
  bool watch_parent(const char* name, std::string parent) {
    const std::uint32_t m = writes_only_ ? mask & ~std::uint32_t(IN_DELETE | IN_MOVED_FROM) : mask;
    const int wd = Io::inotify_add_watch(inotify_.get(), (dir_ + "/" + name).c_str(), m);
    if (wd < 0) return errno == ENOENT || errno == ENOTDIR;  // gone again: nothing to watch
    for (const auto& p : parents_)
      if (p.first == wd) return true;
    parents_.emplace_back(wd, std::move(parent));
    return true;
  }

  // Reads every queued event; true when one of them matters.
  bool drain() {
    alignas(inotify_event) char buf[4096];  // holds at least one event with a 255-byte name
    bool changed = false;
    for (;;) {
      ssize_t n = Io::read(inotify_.get(), buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return changed || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
      for (ssize_t at = 0; at < n;) {
        const auto* ev = reinterpret_cast<const inotify_event*>(buf + at);
        if (relevant(*ev)) changed = true;
        at += static_cast<ssize_t>(sizeof(inotify_event) + ev->len);
      }
    }
  }

  bool relevant(const inotify_event& ev) {
    if (ev.mask & IN_Q_OVERFLOW) {  // parent directories made meanwhile are unknown too
      unwatched_ = true;
      return true;
    }
    const bool self = (ev.mask & (IN_IGNORED | IN_DELETE_SELF | IN_MOVE_SELF)) != 0;
    if (ev.wd == wd_) {
      if (self) {
        wd_ = -1;  // re-added on a later take, once the path is a directory again
        return true;
      }
      if (ev.len == 0 || ev.name[0] == '.') return false;  // publish temps and hidden files
      if (fs_is_parent_name(ev.name)) {                    // a parent directory
        auto parent = below(ev.name);
        if (!parent) return false;
        if ((ev.mask & (IN_CREATE | IN_MOVED_TO)) && !watch_parent(ev.name, std::move(*parent)))
          unwatched_ = true;
        return true;  // made (it may hold keys already) or removed
      }
      if (writes_only_ && (ev.mask & (IN_DELETE | IN_MOVED_FROM))) return false;
      auto key = fs_unescape(ev.name);
      return key && key->find('/') == std::string::npos &&
             key->compare(0, start_.size(), start_) == 0;
    }
    for (auto it = parents_.begin(); it != parents_.end(); ++it) {
      if (it->first != ev.wd) continue;
      if (self) {
        if (ev.mask & IN_IGNORED) parents_.erase(it);  // removed: made again, the root says so
        return true;
      }
      if (ev.len == 0 || ev.name[0] == '.') return false;
      auto rest = fs_unescape(ev.name);  // a key of this directory below the prefix?
      return rest && (it->second + *rest).compare(0, start_.size(), start_) == 0;
    }
    return false;  // a watch given up on
  }

  std::string dir_;
  std::string start_;
  std::chrono::milliseconds recheck_;
  std::chrono::milliseconds poll_;
  bool trust_local_;
  bool writes_only_;  // kv_watch_events::writes: erases do not wake it
  std::chrono::milliseconds interval_ = std::chrono::milliseconds::max();
  basic_fd<Io> inotify_;
  int wd_ = -1;                                       // the namespace directory's watch
  std::vector<std::pair<int, std::string>> parents_;  // watched parent directories: wd, prefix
  bool unwatched_ = false;  // a parent directory below the prefix may lack a watch
  bool pending_ = true;
  clock::time_point due_;
};

}  // namespace detail

/// A kv_store in a shared directory (see the header comment). `Wait` is inotify_wait (local
/// filesystems) or poll_wait (network filesystems); `Durability` is a publish.hpp policy.
template <class Wait = inotify_wait, class Durability = no_sync, class Io = posix_io>
class basic_filesystem_kv {
  static_assert(check_io_policy<Io>());

 public:
  /// Uses `<root>/<run id>/<incarnation>/`, creating the directories that are missing (0755,
  /// parents of `root` included).
  /// Throws holdfast::error naming the directory when it cannot be created.
  basic_filesystem_kv(std::string root, kv_namespace ns)
      : root_(std::move(root)),
        ns_(std::move(ns)),
        dir_(root_ + "/" + detail::fs_escape(ns_.run_id()) + "/" +
             detail::fs_escape(ns_.incarnation())),
        temps_(dir_ + "/" + std::string(temp_directory)) {
    make_dir(root_);
    make_dir(root_ + "/" + detail::fs_escape(ns_.run_id()));
    make_dir(dir_);
    make_dir(temps_);
  }

  /// Another handle on the same root directory, scoped to namespace `ns`.
  basic_filesystem_kv with_namespace(kv_namespace ns) const {
    return basic_filesystem_kv(root_, std::move(ns));
  }
  /// This handle's namespace.
  const kv_namespace& ns() const noexcept { return ns_; }
  /// The directory holding this namespace's keys.
  const std::string& directory() const noexcept { return dir_; }
  /// The file that holds `key` (validated).
  std::string path_of(const std::string& key) const { return locate(key, "kv path").path; }

  /// Stores `value` under `key` unless the key exists (publish_once); true when stored.
  bool insert(const std::string& key, std::string_view value) {
    const place at = locate(key, "kv insert");
    if (!has_parent(at) && insert_with_parent(at, value)) return true;
    // the parent exists now (made here or by another writer first)
    return in_parent(at, false,
                     [&] { return publisher_type(temps_).publish_once(at.path, value, 0644); });
  }

  /// Stores `value` under `key`, replacing any previous value (publish).
  void put(const std::string& key, std::string_view value) {
    const place at = locate(key, "kv put");
    in_parent(at, !has_parent(at), [&] { publisher_type(temps_).publish(at.path, value, 0644); });
  }

  /// The value of `key`, or std::nullopt.
  std::optional<std::string> try_get(const std::string& key) const {
    return read_if_exists(locate(key, "kv try_get").path);
  }

  /// Waits until `key` exists (Wait policy) or `timeout` passes.
  std::optional<std::string> get(const std::string& key, std::chrono::milliseconds timeout) const {
    const place at = locate(key, "kv get");
    // Present already (the common case): one open + read, no inotify set-up and tear-down
    // (closing an inotify descriptor costs the kernel milliseconds).
    if (auto value = read_if_exists(at.path)) return value;
    if (timeout <= decltype(timeout){0}) return std::nullopt;
    if (!at.parent.empty()) make_dir_in(at.parent);  // so inotify can watch it
    return await_file<Wait, Io>(at.path, timeout);
  }

  /// Every key strictly below `prefix + "/"` (all keys for ""), sorted, with its value.
  kv_pairs list(const std::string& prefix) const {
    kv_pairs out;
    for (auto& [key, path] : scan(scope(prefix, "kv list"))) {
      auto value = read_if_exists(path);
      if (value) out.emplace_back(std::move(key), std::move(*value));  // else erased meanwhile
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  /// Removes `key`; true when it existed. Its parent directory stays (the next round's keys
  /// go there: no directory is made and removed per round).
  bool erase(const std::string& key) { return remove(locate(key, "kv erase").path); }

  /// Removes every key strictly below `prefix + "/"` (all keys for ""), and the parent
  /// directories that leaves empty; returns how many keys.
  std::size_t erase_prefix(const std::string& prefix) {
    std::size_t n = 0;
    std::vector<std::string> parents;
    for (const auto& [key, path] : scan(scope(prefix, "kv erase_prefix"))) {
      if (remove(path)) ++n;
      if (key.find('/') != std::string::npos) parents.push_back(detail::fs_escape(parent_of(key)));
    }
    std::sort(parents.begin(), parents.end());
    parents.erase(std::unique(parents.begin(), parents.end()), parents.end());
    for (const auto& p : parents) remove_if_empty(p);
    return n;
  }

  /// Removes what killed writers left, older than `older_than`: publish temps in `.tmp`, the
  /// namespace directory and its parent directories (holdfast::sweep_stale_temps on each), and
  /// an insert's staging directories in `.tmp` (with their content); returns how many.
  std::size_t sweep_stale_temps(std::chrono::milliseconds older_than) const {
    std::size_t n = holdfast::sweep_stale_temps<Io>(dir_, older_than);
    try {
      n += holdfast::sweep_stale_temps<Io>(temps_, older_than);
      const auto now = detail::sweep_clock_now();
      for (const auto& name : detail::list_directory<Io>(temps_)) {
        const std::string path = temps_ + "/" + name;
        struct stat st {};
        if (!is_temp_name(name) || Io::lstat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) ||
            !detail::is_stale(st, now, older_than))  // publish.hpp's age test, as for the files
          continue;
        detail::remove_tree<Io>(path);
        ++n;
      }
    } catch (const error& e) {
      if (e.errnum() != ENOENT) throw;
    }
    for (const auto& name : detail::list_directory<Io>(dir_)) {
      if (name[0] == '.' || !detail::fs_is_parent_name(name)) continue;
      try {
        n += holdfast::sweep_stale_temps<Io>(dir_ + "/" + name, older_than);
      } catch (const error& e) {
        if (e.errnum() != ENOENT) throw;  // removed meanwhile
      }
    }
    return n;
  }

  /// The directory under directory() where writes make their temps: a watch of a key's
  /// directory then sees one event per write (the rename), not the temp's creation and writes.
  static constexpr std::string_view temp_directory = ".tmp";

  /// The watch type: one inotify descriptor on the namespace directory (see watch).
  using watcher = detail::fs_watch<Io>;

  /// How often a watch re-checks where inotify may miss changes (NFS and other network or
  /// unknown filesystems, and always for a Wait policy not derived from inotify_wait):
  /// Wait::recheck (inotify_wait: 500 ms), or Wait::max_interval for a policy without one
  /// (poll_wait: 100 ms). Shadow `recheck` in a custom Wait policy to change it.
  static constexpr std::chrono::milliseconds watch_recheck = detail::fs_recheck<Wait>();
  /// How often a watch without inotify (unavailable, or out of watches) polls:
  /// Wait::max_interval.
  static constexpr std::chrono::milliseconds watch_poll_interval =
      std::chrono::milliseconds(Wait::max_interval);

  /// Follows every key strictly below `prefix + "/"` (all keys for ""), as kv.hpp's "Waiting
  /// on a store" describes: take() reports resync (never events) when such a key may have
  /// changed. One inotify descriptor and one watch on directory(), for the watch's life.
  /// With kv_watch_events::writes, erasing or renaming away a key does not wake it (a
  /// directory's removal still does).
  watcher watch(const std::string& prefix, kv_watch_events events = kv_watch_events::all) const {
    return watcher(dir_, scope(prefix, "kv watch"), watch_recheck, watch_poll_interval,
                   std::is_base_of_v<inotify_wait, Wait>, events);
  }

 private:
  using publisher_type = basic_publisher<Durability, Io>;

  // mkdir -p: creates `dir` and any missing parent.
  static void make_dir(const std::string& dir) {
    if (Io::mkdir(dir.c_str(), 0755) == 0 || errno == EEXIST) return;
    const std::size_t slash = dir.rfind('/');
    if (errno == ENOENT && slash != std::string::npos && slash > 0) {
      make_dir(dir.substr(0, slash));
      if (Io::mkdir(dir.c_str(), 0755) == 0 || errno == EEXIST) return;
    }
    throw error(errno, "mkdir", dir);
  }

  // Where a key lives (see the layout): its parent directory's name under dir_ ("" for a key
  // without '/') and its file.
  struct place {
    std::string parent;
    std::string name;
    std::string path;
  };

  // The prefix whose directory holds the key: its parent less the parent's last segment, or
  // its parent when that has one segment ("h/run/ack/" for "h/run/ack/r0/3", "acks/" for
  // "acks/3", "" for a key without '/'). The segment before a key's last (a protocol's round)
  // is part of the file name, so every round's keys share one directory: none is made per
  // round, and a watch on another directory sleeps through them.
  static std::string_view parent_of(std::string_view key) {
    const std::size_t last = key.rfind('/');
    if (last == std::string_view::npos || last == 0) return std::string_view();
    const std::size_t before = key.rfind('/', last - 1);
    return key.substr(0, (before == std::string_view::npos ? last : before) + 1);
  }

  place locate(const std::string& key, const char* op) const {
    validate_key(key, op);
    const std::string_view parent = parent_of(key);
    place at{detail::fs_escape(parent),
             detail::fs_escape(std::string_view(key).substr(parent.size())), std::string()};
    const std::string& name = at.name;
    auto fits = [&](const std::string& part, const char* what) {
      if (part.size() > 255)
        throw error(ENAMETOOLONG, op, key,
                    std::string("escaped ") + what + " is " + std::to_string(part.size()) +
                        " bytes, above 255");
    };
    fits(at.parent, "directory prefix");
    fits(name, "file name");  // the key past its directory prefix ("r0/3" of "h/run/ack/r0/3")
    at.path = dir_ + "/" + (at.parent.empty() ? name : at.parent + "/" + name);
    return at;
  }

  // Makes the parent directory when `make` (a write found it missing), then runs `write` (a
  // publish to at.path); when that fails with ENOENT because the parent directory is gone again
  // (an erase emptied and removed it meanwhile) or the temps' directory is (the namespace
  // directory was made again), makes them and writes again.
  template <class F>
  auto in_parent(const place& at, bool make, F&& write) -> decltype(write()) {
    if (make) make_dir_in(at.parent);
    for (int attempt = 0;; ++attempt) {
      try {
        return write();
      } catch (const std::system_error& e) {
        if (e.code().value() != ENOENT || attempt == 8) throw;
      }
      make_dir_in(std::string(temp_directory));
      if (!at.parent.empty()) make_dir_in(at.parent);
    }
  }

  // An insert whose parent directory is missing: the key is written into a staging directory in
  // .tmp, which is renamed into place without replacing (publish_directory), so the directory
  // appears holding the key and a watch sees one event (a claim, a round's outcome), not an
  // empty directory and then the key. False when another writer made the directory first
  // (then the insert goes into it). Puts make the directory instead (mkdir): N workers putting
  // their acks into a new directory at once would each stage one, and all but one in vain.
  bool insert_with_parent(const place& at, std::string_view value) {
    const std::string staging = make_staging();
    try {
      // the staged tree is synced by publish_directory, as Durability asks
      if (basic_publisher<no_sync, Io>(temps_).publish_once(staging + "/" + at.name, value, 0644) &&
          publisher_type(temps_).publish_directory(staging, dir_ + "/" + at.parent))
        return true;
    } catch (...) {
      detail::remove_tree<Io>(staging);
      throw;
    }
    detail::remove_tree<Io>(staging);
    return false;
  }

  // True when the key's parent directory exists (or it has none). An lstat, not a mkdir that
  // finds it: a mkdir takes the namespace directory's lock, which every worker acking at once
  // would queue on; a lookup takes none.
  bool has_parent(const place& at) const {
    return at.parent.empty() || exists(dir_ + "/" + at.parent);
  }

  static bool exists(const std::string& path) {
    struct stat st {};
    return Io::lstat(path.c_str(), &st) == 0 || errno != ENOENT;
  }

  // A fresh directory in .tmp (made again when the namespace directory was).
  std::string make_staging() const {
    for (unsigned attempt = 0;; ++attempt) {
      std::string path = detail::temp_path_for<Io>(temps_, "parent", attempt);
      if (Io::mkdir(path.c_str(), 0755) == 0) return path;
      if (errno == ENOENT && attempt == 0) {
        make_dir_in(std::string(temp_directory));
        continue;
      }
      if (errno != EEXIST || attempt >= 16) throw error(errno, "mkdir", path);
    }
  }

  // mkdir of dir_/<name>; an existing one is fine. Throws holdfast::error naming it otherwise
  // (ENOENT when the namespace directory itself is gone). A Durability that syncs parents
  // syncs the namespace directory after making one, so a durable key's directory is durable.
  void make_dir_in(const std::string& name) const {
    const std::string dir = dir_ + "/" + name;
    if (Io::mkdir(dir.c_str(), 0755) != 0) {
      if (errno == EEXIST) return;
      throw error(errno, "mkdir", dir);
    }
    if constexpr (Durability::sync_parent) {
      auto fd = open_file<Io>(dir_, O_RDONLY | O_DIRECTORY);
      detail::sync_dir_fd<Durability>(fd);
      fd.close();
    }
  }

  // rmdir of dir_/<name> when it is empty; best effort (a write may have refilled it).
  void remove_if_empty(const std::string& name) const noexcept {
    (void)Io::rmdir((dir_ + "/" + name).c_str());
  }

  std::string scope(const std::string& prefix, const char* op) const {
    std::string p = normalize_prefix(prefix, op);
    return p.empty() ? std::string() : p + "/";
  }

  // Reads a whole value: sized by fstat (values are published whole, so the size is final),
  // with one extra byte to notice a file that is still growing and finish it with read_all.
  static std::optional<std::string> read_if_exists(const std::string& path) {
    auto fd = open_file_if_exists<Io>(path, O_RDONLY);
    if (!fd) return std::nullopt;
    const auto size = static_cast<std::size_t>(stat_fd(fd).st_size);
    std::string content(size + 1, '\0');
    const std::size_t got = read_full(fd, &content[0], size + 1);
    content.resize(got);
    if (got == size + 1) content += read_all(fd);
    fd.close();
    return content;
  }

  static bool remove(const std::string& path) {
    if (Io::unlink(path.c_str()) == 0) return true;
    if (errno == ENOENT) return false;
    throw error(errno, "unlink", path);
  }

  // The keys that start with `start`, with their files (unsorted): the namespace directory's
  // files, and the files of the parent directories that can hold such keys.
  std::vector<std::pair<std::string, std::string>> scan(const std::string& start) const {
    auto starts = [&](const std::string& s) { return s.compare(0, start.size(), start) == 0; };
    std::vector<std::pair<std::string, std::string>> keys;
    for (const auto& name : detail::list_directory<Io>(dir_)) {
      if (name[0] == '.') continue;  // publish temps, hidden files
      auto decoded = detail::fs_unescape(name);
      if (!decoded) continue;
      if (!detail::fs_is_parent_name(name)) {
        if (starts(*decoded) && decoded->find('/') == std::string::npos)
          keys.emplace_back(*decoded, dir_ + "/" + name);
        continue;
      }
      if (!detail::fs_prefixes_overlap(*decoded, start)) continue;
      std::vector<std::string> files;
      try {
        files = detail::list_directory<Io>(dir_ + "/" + name);
      } catch (const error& e) {
        if (e.errnum() == ENOENT || e.errnum() == ENOTDIR) continue;  // removed meanwhile
        throw;
      }
      for (const auto& file : files) {
        if (file[0] == '.') continue;
        auto rest = detail::fs_unescape(file);
        if (rest && starts(*decoded + *rest))
          keys.emplace_back(*decoded + *rest, dir_ + "/" + name + "/" + file);
      }
    }
    return keys;
  }

  std::string root_;
  kv_namespace ns_;
  std::string dir_;
  std::string temps_;  // dir_ + "/.tmp"
};

/// The filesystem store for local filesystems (inotify wake-ups).
using filesystem_kv = basic_filesystem_kv<inotify_wait>;
/// The filesystem store for network filesystems (NFS, Lustre, FUSE): polls with back-off.
using network_filesystem_kv = basic_filesystem_kv<poll_wait>;

HOLDFAST_NAMESPACE_END
