-- OOM policy: halve the micro-batch on every OOM; once it reaches `min_micro`,
-- stop (taper writes a checkpoint first; `--resume` continues).
--   on_oom = taper.policy.split_then_stop{ min_micro = 4 }
return function(opts)
  opts = opts or {}
  local min_micro = opts.min_micro or 1
  return {
    name = "split_then_stop",
    on_oom = function(self, ev)
      if ev.micro_batch // 2 >= min_micro then
        return { action = "split", micro_batch = ev.micro_batch // 2 }
      end
      return { action = "stop", reason = ("micro-batch %d reached the floor %d"):format(ev.micro_batch, min_micro) }
    end,
  }
end
