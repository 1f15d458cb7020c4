-- OOM policy in the manner of MosaicML Composer's automatic micro-batching:
-- on OOM, halve the micro-batch and retry the same batch; keep the smaller
-- size for the rest of the run; after `max_attempts` OOMs on one step, stop.
--   on_oom = taper.policy.composer_like{}
return function(opts)
  opts = opts or {}
  local max_attempts = opts.max_attempts or 8
  return {
    name = "composer_like",
    on_oom = function(self, ev)
      if ev.attempt >= max_attempts or ev.micro_batch <= 1 then
        return { action = "stop", reason = ("step %d: %d attempts"):format(ev.step, ev.attempt) }
      end
      return { action = "split", micro_batch = math.max(1, ev.micro_batch // 2) }
    end,
  }
end
