-- sidejob-pulse prelude: shared by every script. KEYS[1] is the pool's
-- prefix `{sjp:<escaped name>}:`; every key of the pool starts with it (one
-- hash tag, one slot). ARGV[1] is the run_id of the Redis process the
-- client connected to (a change means a restart or failover).
--
-- Per key k of a job:
--   jobs[k] = payload     the job is wanted (dispatched, not stopped)
--   own[k]  = worker id   "" while orphaned (no owner)
--   tok[k]  = token       the fencing token of the current assignment
--   st[k]   = P | R | S   pending (assigned, not started) | running | stopping
--   pending (zset) k -> Redis ms at which the assignment is due again
--   again (set)   keys dispatched again while their job was stopping: to
--                 run once the stop completes (done.lua moves them into
--                 pending). Counted with pending against max_queued_jobs:
--                 "queued" means dispatched and not yet claimed.
--   wk:<w>  (set) the keys whose record names worker w
--   s:<w>   (stream) worker w's mailbox
-- Pool-wide: meta (hash; ttl, grace, pttl: the worker TTL, grace and
-- pending-job TTL in ms the pool was created with, which every node
-- joining must use), slots (list: the jump-hash buckets, "" = free),
-- members (zset: worker id -> lease expiry, Redis ms). After a shutdown
-- only `closed` is left (a tombstone: the pool stays shut).

local P = KEYS[1]
local RUN = ARGV[1]
local T = redis.call('TIME')
local NOW = tonumber(T[1]) * 1000 + math.floor(tonumber(T[2]) / 1000)
local NOW_US = tonumber(T[1]) * 1000000 + tonumber(T[2])
local META = P .. 'meta'

local function fmt(n) return string.format('%.0f', n) end

local function mget(f) return redis.call('HGET', META, f) end
local function mnum(f) return tonumber(mget(f) or '0') end

-- The next fencing token: above every token issued before, even across a
-- loss of Redis' state, because it is at least the Redis clock in
-- microseconds and no two scripts run in the same microsecond twice over.
local function next_token()
  local t = math.max(mnum('ctr') + 1, NOW_US)
  redis.call('HSET', META, 'ctr', fmt(t))
  return t
end

local function learning() return mnum('learn') > NOW end

-- The meta hash, created if missing. A pool created on a Redis that
-- started less than ttl + grace ago may be a pool Redis lost: no new
-- assignment starts until every lease granted before the loss has lapsed.
-- A Redis process other than the last writer's (restart, failover) means
-- the same: learning mode for ttl + grace, and the generation changes so
-- that workers re-assert (adopt) the jobs they run.
-- Returns false if the pool is missing and epoch is "" (do not create), or
-- if the pool was shut down (the tombstone `closed`: only an explicit
-- reopen, join.lua's flag, removes it).
-- fresh "1" (join.lua only, NodeBuilder::assume_fresh_redis): the user
-- vouches that no pool of this name lived on this Redis before, so a
-- young Redis is no reason to learn. pttl: the creator's pending-job TTL,
-- recorded with its worker TTL and grace (every caller that may create
-- the pool passes it).
local function ensure(ttl, grace, epoch, fresh, pttl)
  if redis.call('EXISTS', META) == 0 then
    if epoch == '' or redis.call('EXISTS', P .. 'closed') == 1 then return false end
    local learn = NOW
    if fresh ~= '1' then
      -- uptime_in_seconds is floor(now) - floor(start) in whole seconds of
      -- the wall clock: it reads 1 a few ms after start if a second
      -- boundary passed. The true uptime is above up - 1 and may be far
      -- below up; learning must never end early, so the start is taken
      -- to be as late as it can be: up - 1 seconds ago.
      local info = redis.call('INFO', 'server')
      local up = tonumber(string.match(info, 'uptime_in_seconds:(%d+)')) or 0
      learn = NOW - math.max(0, up - 1) * 1000 + ttl + grace
    end
    redis.call('HSET', META, 'ver', fmt(NOW_US), 'ctr', fmt(NOW_US), 'shut', '0',
      'learn', fmt(learn), 'run', RUN, 'loss', '0', 'epoch', epoch .. '.' .. fmt(NOW_US),
      'ttl', fmt(ttl), 'grace', fmt(grace), 'pttl', fmt(pttl or 0))
    return true
  end
  if mget('run') ~= RUN then
    redis.call('HSET', META, 'run', RUN,
      'learn', fmt(math.max(mnum('learn'), NOW + ttl + grace)))
    redis.call('HINCRBY', META, 'loss', 1)
  end
  return true
end

-- Whether the pool was shut down (and not reopened since).
local function shut_down() return redis.call('EXISTS', P .. 'closed') == 1 end

local function generation() return (mget('epoch') or '') .. ':' .. (mget('loss') or '0') end

local function slots() return redis.call('LRANGE', P .. 'slots', 0, -1) end

local function send(w, fields)
  if w == '' then return end
  redis.call('XADD', P .. 's:' .. w, 'MAXLEN', '~', '100000', '*', unpack(fields))
end

-- Tells every member that the membership changed.
-- The version only grows, across a loss of state too (it is at least
-- Redis' clock in microseconds), so a node never mistakes an old view for
-- a new one.
local function bump_members()
  local v = math.max(mnum('ver') + 1, NOW_US)
  redis.call('HSET', META, 'ver', fmt(v))
  for _, w in ipairs(redis.call('ZRANGE', P .. 'members', 0, -1)) do
    send(w, {'t', 'm', 'v', fmt(v)})
  end
  return v
end

-- Assigns job k to worker w ("" or learning mode: an orphan, due at once)
-- with a new token, and mails w the start.
local function assign(k, w, pttl)
  if learning() then w = '' end
  local old = redis.call('HGET', P .. 'own', k)
  if old and old ~= '' then redis.call('SREM', P .. 'wk:' .. old, k) end
  local t = next_token()
  redis.call('SREM', P .. 'again', k)
  redis.call('HSET', P .. 'own', k, w)
  redis.call('HSET', P .. 'tok', k, fmt(t))
  redis.call('HSET', P .. 'st', k, 'P')
  if w == '' then
    redis.call('ZADD', P .. 'pending', 0, k)
  else
    redis.call('ZADD', P .. 'pending', NOW + pttl, k)
    redis.call('SADD', P .. 'wk:' .. w, k)
    send(w, {'t', 's', 'k', k, 'tok', fmt(t), 'p', redis.call('HGET', P .. 'jobs', k)})
  end
  return t
end

-- Forgets job k's record (not its payload).
local function drop_record(k)
  local old = redis.call('HGET', P .. 'own', k)
  if old and old ~= '' then redis.call('SREM', P .. 'wk:' .. old, k) end
  redis.call('HDEL', P .. 'own', k)
  redis.call('HDEL', P .. 'tok', k)
  redis.call('HDEL', P .. 'st', k)
  redis.call('ZREM', P .. 'pending', k)
  redis.call('SREM', P .. 'again', k)
end

-- Jobs queued: dispatched and not yet claimed (pending, or waiting for
-- their old run to stop). What max_queued_jobs bounds.
local function queued()
  return redis.call('ZCARD', P .. 'pending') + redis.call('SCARD', P .. 'again')
end

-- Worker w leaves the membership for good: its slot is freed, and each job
-- its records name becomes an orphan (or is forgotten if it was stopping
-- and nobody wants it any more). Returns whether it was a member.
local function remove_worker(w)
  local was = redis.call('ZREM', P .. 'members', w)
  local idx = redis.call('LPOS', P .. 'slots', w)
  if idx then redis.call('LSET', P .. 'slots', idx, '') end
  for _, k in ipairs(redis.call('SMEMBERS', P .. 'wk:' .. w)) do
    redis.call('SREM', P .. 'again', k)
    if redis.call('HGET', P .. 'jobs', k) then
      redis.call('HSET', P .. 'own', k, '')
      redis.call('HSET', P .. 'st', k, 'P')
      redis.call('ZADD', P .. 'pending', 0, k)
    else
      redis.call('HDEL', P .. 'own', k)
      redis.call('HDEL', P .. 'tok', k)
      redis.call('HDEL', P .. 'st', k)
      redis.call('ZREM', P .. 'pending', k)
    end
  end
  redis.call('DEL', P .. 'wk:' .. w, P .. 's:' .. w)
  if idx or was == 1 then bump_members() end
  return was == 1
end

-- Removes every member whose lease ran out more than grace ago (Redis time).
local function reap(grace)
  local dead = redis.call('ZRANGEBYSCORE', P .. 'members', '-inf', '(' .. fmt(NOW - grace), 'LIMIT', 0, 100)
  for _, w in ipairs(dead) do remove_worker(w) end
  return #dead
end

local function is_live(w)
  local e = redis.call('ZSCORE', P .. 'members', w)
  return e and tonumber(e) >= NOW
end
