-- OOM policy that escalates through the remedies users reach for, cheapest
-- first: split the micro-batch down to `min_micro` (same gradient, more steps
-- of work), then recompute the model's blocks in the backward (same gradient,
-- about 5-30% more time), then offload AdamW's moments to a file (the same
-- updates; 8 bytes per parameter out of memory), then switch forward and
-- backward to `precision`, then stop (taper writes a checkpoint first;
-- `--resume` continues). After `after` clean steps it grows the micro-batch
-- back, never to a size that ran out of memory. Recomputation needs a model
-- with repeated blocks (a GPT): give `recompute = false` for others;
-- `offload = false` keeps the moments in memory (and suits SGD), and
-- `precision = false` stays in f32.
--   on_oom = taper.policy.escalate{ min_micro = 8, after = 50 }
return function(opts)
  opts = opts or {}
  local min_micro = opts.min_micro or 1
  local after = opts.after or 100
  local recompute = opts.recompute ~= false
  local offload = opts.offload ~= false
  local precision = opts.precision == nil and "bf16" or opts.precision
  return {
    name = "escalate",
    ceiling = nil,
    on_oom = function(self, ev)
      if self.ceiling == nil or ev.micro_batch < self.ceiling then
        self.ceiling = ev.micro_batch
      end
      if ev.micro_batch // 2 >= min_micro then
        return { action = "split", micro_batch = ev.micro_batch // 2 }
      end
      if recompute and ev.recompute ~= 1 then
        return { action = "recompute", every = 1 }
      end
      if offload and not ev.offload then
        return "offload"
      end
      if precision and ev.precision == "f32" then
        return { action = "precision", precision = precision }
      end
      return {
        action = "stop",
        reason = ("out of memory at micro-batch %d (floor %d)%s%s%s"):format(
          ev.micro_batch, min_micro,
          recompute and ", recomputing every block" or "",
          offload and ", moments offloaded" or "",
          precision and (", in " .. ev.precision) or ""),
      }
    end,
    -- Growing back is grow_back's (with its default margin), reading the
    -- ceiling this table keeps.
    on_step = taper.policy.grow_back{ after = after }.on_step,
  }
end
