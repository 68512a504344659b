// A map whose values are made once: however many threads ask for a key at the same moment, one
// of them makes the value and the others wait for it. A failure is not remembered: the next
// request tries again (after a source fix, a freed disk, ...). Used for compiled kernels and for
// modules loaded per context.
#pragma once

#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <utility>

namespace flashjit::detail {

template <typename Key, typename Value>
class OnceMap {
 public:
  // The value for `key`, made by `make()` if no thread has made it yet. `*made_here` (optional)
  // says whether this call made it.
  template <typename Make>
  Value get(const Key& key, Make&& make, bool* made_here = nullptr) {
    std::promise<Value> promise;
    std::shared_future<Value> future;
    bool owner = false;
    {
      std::lock_guard lock(mutex_);
      if (auto it = values_.find(key); it != values_.end()) {
        future = it->second;
      } else {
        future = promise.get_future().share();
        values_.emplace(key, future);
        owner = true;
      }
    }
    if (made_here) *made_here = owner;
    if (!owner) return future.get();
    try {
      Value value = make();
      promise.set_value(value);
      return value;
    } catch (...) {
      promise.set_exception(std::current_exception());
      std::lock_guard lock(mutex_);
      values_.erase(key);
      throw;
    }
  }

  // The value for `key` if one is made already; never waits, never makes one.
  std::optional<Value> find_made(const Key& key) {
    std::lock_guard lock(mutex_);
    auto it = values_.find(key);
    if (it == values_.end() ||
        it->second.wait_for(std::chrono::seconds(0)) != std::future_status::ready)
      return std::nullopt;
    try {
      return it->second.get();
    } catch (...) {
      return std::nullopt;  // its making failed; the next get() tries again
    }
  }

  // Calls f(key, value) for every value made so far (e.g. to unload modules at exit).
  template <typename F>
  void for_each_ready(F&& f) {
    std::lock_guard lock(mutex_);
    for (auto& [key, future] : values_)
      if (future.wait_for(std::chrono::seconds(0)) == std::future_status::ready) {
        try {
          f(key, future.get());
        } catch (...) {
          // A value whose making failed has no resources to visit.
        }
      }
  }

 private:
  std::mutex mutex_;
  std::map<Key, std::shared_future<Value>> values_;
};

}  // namespace flashjit::detail
