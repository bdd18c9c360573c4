-- adopt(run, ttl, grace, wid, key, tok, payload): after Redis lost state
-- (a new generation), worker wid re-asserts a job it runs under token tok.
-- Nothing can have started it elsewhere since (learning mode), so a
-- missing or pending record becomes running(wid, tok); a record that is
-- running under another owner and token wins, and wid must stop.
-- -> {'OK'} | {'STOP'} | {'GONE'} (wid is not a member: register first)
if not ensure(tonumber(ARGV[2]), tonumber(ARGV[3]), '') then return {'STOP'} end
local w, k, t, p = ARGV[4], ARGV[5], ARGV[6], ARGV[7]
if not is_live(w) then return {'GONE'} end
local st = redis.call('HGET', P .. 'st', k)
local own = redis.call('HGET', P .. 'own', k)
local tok = redis.call('HGET', P .. 'tok', k)
if st == 'S' and own == w and tok == t then return {'STOP'} end
if (st == 'R' or st == 'S') and tok ~= t then return {'STOP'} end
if not st and redis.call('HEXISTS', P .. 'jobs', k) == 0 then
  redis.call('HSET', P .. 'jobs', k, p)
end
if redis.call('HEXISTS', P .. 'jobs', k) == 0 then return {'STOP'} end
if own and own ~= '' then redis.call('SREM', P .. 'wk:' .. own, k) end
redis.call('ZREM', P .. 'pending', k)
redis.call('SREM', P .. 'again', k)
redis.call('HSET', P .. 'own', k, w)
redis.call('HSET', P .. 'tok', k, t)
redis.call('HSET', P .. 'st', k, 'R')
redis.call('SADD', P .. 'wk:' .. w, k)
redis.call('HSET', META, 'ctr', fmt(math.max(mnum('ctr'), tonumber(t))))
return {'OK'}
