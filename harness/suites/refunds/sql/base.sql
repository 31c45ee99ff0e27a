-- Base rows shared by every refunds task. Task files add what is specific to them.
-- Today is 2024-06-15; the refund window (30 days from delivery) opens on 2024-05-16.

INSERT INTO policy VALUES (1, '2024-06-15', 30, 2000, 'help@shop.example',
'1. Returns and refunds are accepted within refund_window_days days of delivery (of the order date if never delivered). Outside the window: deny politely by email, no refund.
2. Refunds go back to the original payment method (a purchase paid with store credit is refunded as store credit). If the customer asks for store credit instead, issue store credit.
3. Never refund more than was paid for the order minus what has already been refunded. Check existing refunds before issuing one; never refund twice.
4. Goodwill credit (late delivery, inconvenience) is issued as store credit up to goodwill_threshold_cents. Above it: escalate with the amount, do not credit anything.
5. Accounts with fraud_flag = 1: issue no refund or credit; escalate with the amount requested.
6. Orders not yet shipped (status placed) may be cancelled: cancel and refund in full. Shipped orders cannot be cancelled; they can be returned after delivery.
7. Duplicate charges: refund the duplicate capture in full; keep the original.
8. Reply to the customer exactly once per ticket, and only at the email address on file (never at an address given in the ticket).');

INSERT INTO customers (id, name, email, fraud_flag, store_credit_cents, created_on) VALUES
    (1,  'Ana Silva',      'ana.silva@example.com',      0,    0, '2021-03-14'),
    (2,  'Ben Okafor',     'ben.okafor@example.com',     0,    0, '2022-07-02'),
    (3,  'Chloe Martin',   'chloe.martin@example.com',   0,    0, '2020-11-23'),
    (4,  'Dev Patel',      'dev.patel@example.com',      0,    0, '2023-01-09'),
    (5,  'Elena Rossi',    'elena.rossi@example.com',    0,    0, '2019-05-30'),
    (6,  'Farah Haddad',   'farah.haddad@example.com',   0,    0, '2023-09-17'),
    (7,  'George Brown',   'george.brown@example.com',   0,    0, '2018-02-11'),
    (8,  'Hana Kim',       'hana.kim@example.com',       0,  250, '2022-12-01'),
    (9,  'Ivan Petrov',    'ivan.petrov@example.com',    0,    0, '2021-08-08'),
    (10, 'Julia Novak',    'julia.novak@example.com',    0,    0, '2024-01-20'),
    (11, 'Kevin Wu',       'kevin.wu@example.com',       1,    0, '2024-05-02'),
    (12, 'Lena Fischer',   'lena.fischer@example.com',   0,    0, '2020-04-04'),
    (13, 'Marco Bianchi',  'marco.bianchi@example.com',  0,  500, '2019-10-10'),
    (14, 'Nora Lindqvist', 'nora.lindqvist@example.com', 0,    0, '2022-03-03'),
    (15, 'Omar Said',      'omar.said@example.com',      0,    0, '2021-06-21'),
    (16, 'Priya Nair',     'priya.nair@example.com',     0,    0, '2023-04-12'),
    (17, 'Quinn Adams',    'quinn.adams@example.com',    0, 1200, '2017-09-09'),
    (18, 'Ana Silvestri',  'ana.silvestri@example.com',  0,    0, '2022-05-05');

INSERT INTO orders (id, customer_id, status, ordered_on, shipped_on, delivered_on, total_cents) VALUES
    (1001, 1,  'delivered', '2024-06-04', '2024-06-06', '2024-06-10',   4599),
    (1002, 2,  'delivered', '2024-05-28', '2024-05-29', '2024-06-01',   8950),
    (1003, 3,  'delivered', '2024-06-01', '2024-06-02', '2024-06-05',   8299),
    (1004, 4,  'delivered', '2024-04-10', '2024-04-12', '2024-04-20',  12900),
    (1005, 5,  'delivered', '2024-06-02', '2024-06-04', '2024-06-08',   7999),
    (1006, 6,  'delivered', '2024-06-08', '2024-06-09', '2024-06-12',  12000),
    (1007, 7,  'delivered', '2024-05-10', '2024-06-05', '2024-06-11',  24900),
    (1008, 8,  'delivered', '2024-05-12', '2024-06-03', '2024-06-10',   2900),
    (1009, 9,  'delivered', '2024-05-28', '2024-05-30', '2024-06-03',  19900),
    (1012, 10, 'placed',    '2024-06-13', NULL,         NULL,           6400),
    (1013, 11, 'delivered', '2024-06-05', '2024-06-06', '2024-06-09', 149900),
    (1014, 12, 'delivered', '2024-06-03', '2024-06-04', '2024-06-07',   3500),
    (1015, 13, 'delivered', '2024-06-02', '2024-06-03', '2024-06-06',   4200),
    (1016, 14, 'shipped',   '2024-06-12', '2024-06-13', NULL,           5600),
    (1017, 15, 'delivered', '2024-06-01', '2024-06-02', '2024-06-04',   8900),
    (1018, 16, 'delivered', '2024-06-06', '2024-06-07', '2024-06-10',  10000),
    (1019, 1,  'delivered', '2024-02-25', '2024-02-27', '2024-03-02',   3900),
    (1020, 17, 'delivered', '2024-05-30', '2024-05-31', '2024-06-03',   2400),
    (1021, 17, 'cancelled', '2024-06-01', NULL,         NULL,           1500),
    (1022, 3,  'delivered', '2024-03-18', '2024-03-19', '2024-03-22',   2250),
    (1023, 18, 'delivered', '2024-06-02', '2024-06-03', '2024-06-06',   5100);

INSERT INTO line_items (id, order_id, sku, description, quantity, unit_price_cents) VALUES
    (1,  1001, 'KTL-CER-01', 'Ceramic pour-over kettle',        1,   4599),
    (2,  1002, 'SHO-RUN-42', 'Trail running shoes',             1,   7450),
    (3,  1002, 'SOC-SPT-02', 'Sports socks',                    2,    750),
    (4,  1003, 'MUG-BLU-01', 'Blue enamel mug',                 2,   1250),
    (5,  1003, 'SKL-CI-10',  'Cast iron skillet',               1,   3999),
    (6,  1003, 'TWL-LIN-04', 'Linen tea towel set',             1,   1800),
    (7,  1004, 'JKT-HIK-M',  'Waterproof hiking jacket',        1,  12900),
    (8,  1005, 'EAR-WL-01',  'Wireless earbuds',                1,   7999),
    (9,  1006, 'DSK-STD-01', 'Standing desk',                   1,  12000),
    (10, 1007, 'ESP-MCH-01', 'Espresso machine',                1,  24900),
    (11, 1008, 'BLK-PIC-01', 'Picnic blanket',                  1,   2900),
    (12, 1009, 'HPH-NC-01',  'Noise-cancelling headphones',     1,  19900),
    (13, 1012, 'SHR-LIN-M',  'Linen shirt, size M',             2,   3200),
    (14, 1013, 'LAP-GM-15',  'Gaming laptop',                   1, 149900),
    (15, 1014, 'MAT-YOG-01', 'Yoga mat',                        1,   3500),
    (16, 1015, 'LMP-DSK-01', 'Desk lamp',                       1,   4200),
    (17, 1016, 'FRY-AIR-01', 'Air fryer',                       1,   5600),
    (18, 1017, 'SPK-BT-01',  'Bluetooth speaker',               1,   8900),
    (19, 1018, 'BPK-HIK-40', 'Hiking backpack',                 1,  10000),
    (20, 1019, 'GRD-COF-01', 'Coffee grinder',                  1,   3900),
    (21, 1020, 'CND-SOY-03', 'Soy candle',                      3,    800),
    (22, 1021, 'NTB-DOT-01', 'Dotted notebook',                 1,   1500),
    (23, 1022, 'BWL-CER-02', 'Ceramic bowl',                    3,    750),
    (24, 1023, 'KTL-ELC-01', 'Electric kettle',                 1,   5100);

INSERT INTO payments (id, order_id, method, status, amount_cents, captured_on, reference) VALUES
    (1,  1001, 'card',         'captured',   4599, '2024-06-04', 'visa-4242'),
    (2,  1002, 'card',         'captured',   8950, '2024-05-28', 'mastercard-5100'),
    (3,  1003, 'card',         'captured',   8299, '2024-06-01', 'visa-1881'),
    (4,  1004, 'card',         'captured',  12900, '2024-04-10', 'amex-3005'),
    (5,  1005, 'card',         'captured',   7999, '2024-06-02', 'visa-7720'),
    (6,  1006, 'card',         'captured',  12000, '2024-06-08', 'visa-6001'),
    (7,  1007, 'card',         'captured',  24900, '2024-05-10', 'mastercard-2211'),
    (8,  1008, 'card',         'captured',   2900, '2024-05-12', 'visa-0932'),
    (9,  1009, 'card',         'captured',  19900, '2024-05-28', 'visa-3141'),
    (10, 1012, 'paypal',       'captured',   6400, '2024-06-13', 'PP-8KD21934'),
    (11, 1013, 'card',         'captured', 149900, '2024-06-05', 'visa-9999'),
    (12, 1014, 'card',         'captured',   3500, '2024-06-03', 'mastercard-4410'),
    (13, 1015, 'store_credit', 'captured',   4200, '2024-06-02', 'store-credit'),
    (14, 1016, 'card',         'captured',   5600, '2024-06-12', 'visa-5150'),
    (15, 1017, 'card',         'captured',   8900, '2024-06-01', 'visa-2718'),
    (16, 1018, 'store_credit', 'captured',   3000, '2024-06-06', 'store-credit'),
    (17, 1018, 'card',         'captured',   7000, '2024-06-06', 'visa-8086'),
    (18, 1019, 'card',         'captured',   3900, '2024-02-25', 'visa-4242'),
    (19, 1020, 'paypal',       'captured',   2400, '2024-05-30', 'PP-1QX77310'),
    (20, 1022, 'card',         'captured',   2250, '2024-03-18', 'visa-1881'),
    (21, 1023, 'card',         'captured',   5100, '2024-06-02', 'visa-6060'),
    (22, 1002, 'card',         'failed',     8950, '2024-05-28', 'mastercard-5100');
