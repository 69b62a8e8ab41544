#!/bin/bash
cd /app && echo "$(cat key.txt)" > out.txt
