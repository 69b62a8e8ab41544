#!/bin/bash
cd /app
grep -rl "get_usr" --include='*.py' . | xargs sed -i 's/get_usr/get_user/g'
