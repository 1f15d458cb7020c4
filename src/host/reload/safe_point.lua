-- Safe points: the places where a run may switch to a new version of its
-- scripts. They are Lua functions so that they can yield the recipe's
-- coroutine back to the host, which then tries the new version (see
-- src/host/reload/mod.rs). `host` holds the Rust side; `host.thread` is the
-- coroutine of the version that is running.
local host = ...
local running, isyieldable, yield = coroutine.running, coroutine.isyieldable, coroutine.yield

-- Returns true when a reload was applied here.
local function safe_point(run, opts)
  if running() ~= host.thread or not isyieldable() then
    -- Inside the recipe's own coroutine, or called from native code.
    return false
  end
  local action = host.poll(run, opts)
  if action == nil then
    return false
  end
  return yield(action) == true
end

-- run:epochs(n): the end of each epoch is a safe point.
local function epochs(run, n)
  host.set_epochs(run, n)
  return function()
    host.epoch_end(run)
    safe_point(run, nil)
    return host.epoch_begin(run, n)
  end
end

-- run:reload_point([{ wait = seconds }]): a finer safe point.
local function reload_point(run, opts)
  return safe_point(run, opts)
end

-- require, remembering which files the recipe's modules come from so that
-- they are watched and re-evaluated on reload.
local require0, searchpath, loaded = require, package.searchpath, package.loaded
local function require(name)
  if type(name) == "string" and loaded[name] == nil then
    local path = searchpath(name, package.path)
    if path then
      host.watch_module(name, path)
    end
  end
  return require0(name)
end

return epochs, reload_point, require
