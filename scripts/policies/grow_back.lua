-- OOM policy that recovers upward: split on OOM, and after `after` clean steps
-- try a micro-batch twice as large. It remembers the smallest size that ran
-- out of memory (the ceiling) and never goes back to it: it grows to at most
-- `margin` of the ceiling instead of oscillating.
--   on_oom = taper.policy.grow_back{ after = 50, margin = 0.75 }
return function(opts)
  opts = opts or {}
  local after = opts.after or 100
  local margin = opts.margin or 0.75
  return {
    name = "grow_back",
    ceiling = nil,
    on_oom = function(self, ev)
      if self.ceiling == nil or ev.micro_batch < self.ceiling then
        self.ceiling = ev.micro_batch
      end
      if ev.micro_batch <= 1 then
        return { action = "stop", reason = "out of memory with a micro-batch of 1" }
      end
      return { action = "split", micro_batch = ev.micro_batch // 2 }
    end,
    on_step = function(self, info)
      if info.clean_steps < after or info.micro_batch >= info.batch_size then
        return nil
      end
      local target = math.min(info.micro_batch * 2, info.batch_size)
      if self.ceiling and target >= self.ceiling then
        target = math.floor(self.ceiling * margin)
      end
      if target > info.micro_batch then
        return { micro_batch = target }
      end
    end,
  }
end
