-- Tundra evaluation: the update workload (bench/eval/databases.py made this file).
local PLAN = {targets = {{table = "`orders`", keyfile = "/work/main/target/bench-cache/tpch-quick/derived-mariadb/keys/orders.keys", rows = 15000, width = 6, key = {{name = "`o_orderkey`", number = true}}, read = "CHAR_LENGTH(`o_comment`)", changes = {{column = "`o_totalprice`", kind = "delta", low = 0, high = 100, decimals = 2}, {column = "`o_comment`", kind = "text", low = 0, high = 0, decimals = 0}}, insert_key = "`o_orderkey`", insert_from = 60001, columns = {"`o_orderkey`", "`o_custkey`", "`o_orderstatus`", "`o_totalprice`", "`o_orderdate`", "`o_orderpriority`", "`o_clerk`", "`o_shippriority`", "`o_comment`"}}, {table = "`lineitem`", keyfile = "/work/main/target/bench-cache/tpch-quick/derived-mariadb/keys/lineitem.keys", rows = 60175, width = 8, key = {{name = "`l_orderkey`", number = true}, {name = "`l_linenumber`", number = true}}, read = "CHAR_LENGTH(`l_comment`)", changes = {{column = "`l_quantity`", kind = "int", low = 1, high = 50, decimals = 0}, {column = "`l_comment`", kind = "text", low = 0, high = 0, decimals = 0}}}, {table = "`partsupp`", keyfile = "/work/main/target/bench-cache/tpch-quick/derived-mariadb/keys/partsupp.keys", rows = 8000, width = 9, key = {{name = "`ps_partkey`", number = true}, {name = "`ps_suppkey`", number = true}}, read = "CHAR_LENGTH(`ps_comment`)", changes = {{column = "`ps_availqty`", kind = "int", low = 1, high = 9999, decimals = 0}, {column = "`ps_comment`", kind = "text", low = 0, high = 0, decimals = 0}}}}, threads = 4, backslash_escapes = true, vocabulary = "/work/main/target/bench-cache/tpch-quick/derived-mariadb/vocabulary.txt", session_sql = "SET NAMES utf8mb4"}

local drv, con
local words, keyfiles, next_insert = {}, {}, {}

local function quote(v)
   if PLAN.backslash_escapes then
      v = v:gsub("\\", "\\\\")
   end
   v = v:gsub("'", "''")
   return "'" .. v .. "'"
end

function thread_init(thread_id)
   drv = sysbench.sql.driver()
   con = drv:connect()
   if PLAN.session_sql then
      con:query(PLAN.session_sql)
   end
   if PLAN.vocabulary then
      for w in io.lines(PLAN.vocabulary) do
         words[#words + 1] = w
      end
   end
   for i, t in ipairs(PLAN.targets) do
      keyfiles[i] = assert(io.open(t.keyfile, "rb"))
      if t.insert_key then
         next_insert[i] = t.insert_from + thread_id
      end
   end
end

function thread_done()
   for _, f in ipairs(keyfiles) do
      f:close()
   end
   con:disconnect()
end

-- A transient error (deadlock, lock wait timeout, unique violation) restarts the event: end what
-- is left of its transaction first.
function sysbench.hooks.before_restart_event(err)
   con:query("ROLLBACK")
end

local function characters(s)
   local _, n = s:gsub("[^\128-\191]", "")
   return n
end

-- New text of n characters: random vocabulary words separated by spaces, cut to length.
local function new_text(n)
   local parts, length = {}, -1
   while length < n do
      local w = words[sysbench.rand.uniform(1, #words)]
      parts[#parts + 1] = w
      length = length + characters(w) + 1
   end
   local s, pos = table.concat(parts, " "), 1
   for _ = 1, n do
      local b = s:byte(pos)
      pos = pos + (b < 0x80 and 1 or b < 0xE0 and 2 or b < 0xF0 and 3 or 4)
   end
   return s:sub(1, pos - 1)
end

-- The WHERE condition of a row chosen uniformly among the rows in the target's key file.
local function pick_row(i, t)
   local f = keyfiles[i]
   f:seek("set", sysbench.rand.uniform(0, t.rows - 1) * t.width)
   local record = f:read(t.width)
   local line = record:sub(1, record:find("\n", 1, true) - 1)
   local conditions, k = {}, 0
   for v in (line .. "\t"):gmatch("([^\t]*)\t") do
      k = k + 1
      local column = t.key[k]
      conditions[k] = column.name .. " = " .. (column.number and v or quote(v))
   end
   return table.concat(conditions, " AND ")
end

local function new_value(c, old_length)
   if c.kind == "text" then
      return old_length and quote(new_text(tonumber(old_length))) or c.column
   elseif c.kind == "int" then
      return string.format("%d", sysbench.rand.uniform(c.low, c.high))
   end
   local scale = 10 ^ c.decimals
   local steps = sysbench.rand.uniform(0, 2 * c.high * scale) - c.high * scale
   return string.format("%s + (%." .. c.decimals .. "f)", c.column, steps / scale)
end

function event()
   con:query("BEGIN")
   for i, t in ipairs(PLAN.targets) do
      local where = pick_row(i, t)
      local rs = con:query("SELECT " .. t.read .. " FROM " .. t.table .. " WHERE " .. where .. " LIMIT 1")
      local row = rs and rs:fetch_row()
      if row then
         local old, sets, k = {}, {}, 0
         for j, c in ipairs(t.changes) do
            if c.kind == "text" then
               k = k + 1
               old[j] = row[k]
            end
            sets[j] = c.column .. " = " .. new_value(c, old[j])
         end
         con:query("UPDATE " .. t.table .. " SET " .. table.concat(sets, ", ") .. " WHERE " .. where)
         if t.insert_key then
            local values = {}
            for j, column in ipairs(t.columns) do
               values[j] = column
               if column == t.insert_key then
                  values[j] = string.format("%d", next_insert[i])
               end
               for m, c in ipairs(t.changes) do
                  if c.column == column then
                     values[j] = new_value(c, old[m])
                  end
               end
            end
            next_insert[i] = next_insert[i] + PLAN.threads
            con:query("INSERT INTO " .. t.table .. " (" .. table.concat(t.columns, ", ") .. ") SELECT " ..
                      table.concat(values, ", ") .. " FROM " .. t.table .. " WHERE " .. where .. " LIMIT 1")
         end
      end
   end
   con:query("COMMIT")
end
