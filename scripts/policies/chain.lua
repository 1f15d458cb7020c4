-- Composes policies: on OOM (and after each clean step) ask each in turn; the
-- first that returns something decides. A policy is a function(event) or a
-- table with on_oom/on_step methods.
--   on_oom = taper.policy.chain{ my_policy, taper.policy.split_then_stop{} }
return function(policies)
  local function call(p, hook, arg)
    if type(p) == "function" then
      if hook == "on_oom" then return p(arg) end
      return nil
    end
    local f = p[hook]
    if f then return f(p, arg) end
  end
  return {
    name = "chain",
    on_oom = function(self, ev)
      for _, p in ipairs(policies) do
        local action = call(p, "on_oom", ev)
        if action ~= nil then return action end
      end
    end,
    on_step = function(self, info)
      for _, p in ipairs(policies) do
        local plan = call(p, "on_step", info)
        if plan ~= nil then return plan end
      end
    end,
  }
end
