-- One tiny table. The benign agent sets v to 'done'; hostile agents never do, so their
-- grade fails deterministically (and an escape through the state file would show here).
CREATE TABLE job (id INTEGER PRIMARY KEY, v TEXT NOT NULL);
INSERT INTO job (id, v) VALUES (1, 'todo');
