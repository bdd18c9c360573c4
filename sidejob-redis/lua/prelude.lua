-- Shared by every sidejob-redis script. KEYS: meta, held, exp, info, starve
-- (all under the budget's hash tag {sj:<name>}).
local meta, held, exp, info, starve = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]

local function num(v)
  if v == false or v == nil then return nil end
  return tonumber(v)
end

-- Integers as decimal strings: Lua 5.1 would print large ones as 1.7e+12.
local function fmt(x)
  return string.format('%d', x)
end

-- Redis server time in milliseconds. A budget created in test mode may pin
-- it (`debug_now`) or shift it (`debug_offset`); no other budget can.
local function clock()
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  if redis.call('HGET', meta, 'test') == '1' then
    local fixed = num(redis.call('HGET', meta, 'debug_now'))
    if fixed then return fixed end
    now = now + (num(redis.call('HGET', meta, 'debug_offset')) or 0)
  end
  return now
end

-- Deletes every entry of node `n` except meta's totals.
local function forget(n)
  redis.call('HDEL', held, n)
  redis.call('ZREM', exp, n)
  redis.call('HDEL', info, n .. ':want', n .. ':need', n .. ':ver', n .. ':req')
  redis.call('ZREM', starve, n)
end
