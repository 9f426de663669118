// An advisory lock on a checkpoint directory, so that two jobs never save into one
// directory (they would race on `latest` and mix their tags).
//
// [Save Dir Lock]
//  * flock(LOCK_EX | LOCK_NB) on DIR/.zerotrain.lock, held until the DirLock is destroyed
//    or the process ends (the kernel releases it when the holder dies: no stale locks).
//  * The holder writes "host <name> pid <pid> since <UTC time>" into the file; a job that
//    finds the lock taken reads it back and names the other job.
//  * Advisory: it binds zerotrain jobs (`zerotrain train --save` takes it on rank 0 before
//    the first step; the engine's save_checkpoint takes it on rank 0 at its first save into
//    a directory and keeps it while the process lives), not other programs.
//  * Within one process the lock is shared: a second acquire of a directory this process
//    already holds succeeds and shares the one flock, released with the last holder. On file systems without flock (some network
//    file systems) the lock cannot be taken and the job is told so.
#pragma once
#include <memory>
#include <string>

namespace zt::ckpt {

class DirLock {
 public:
  // Creates DIR if needed and takes its lock, or throws CheckpointError naming the
  // holder ("... is in use by another zerotrain job: host H pid P since T ...").
  static std::unique_ptr<DirLock> acquire(const std::string& dir);
  ~DirLock();
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;
  const std::string& path() const;

 private:
  struct Held;
  explicit DirLock(std::shared_ptr<Held> held) : held_(std::move(held)) {}
  std::shared_ptr<Held> held_;
};

}  // namespace zt::ckpt
