-- notify(run, key, payload): mails the job's current owner.
-- -> {'OK'} | {'NOTFOUND'} | {'NOPOOL'} | {'CLOSED'}
if redis.call('EXISTS', META) == 0 then return {shut_down() and 'CLOSED' or 'NOPOOL'} end
local k = ARGV[2]
local w = redis.call('HGET', P .. 'own', k)
if redis.call('HEXISTS', P .. 'jobs', k) == 0 or not w or w == '' then return {'NOTFOUND'} end
send(w, {'t', 'n', 'k', k, 'tok', redis.call('HGET', P .. 'tok', k), 'p', ARGV[3]})
return {'OK'}
